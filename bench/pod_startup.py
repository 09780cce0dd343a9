#!/usr/bin/env python3
"""Pod startup on a real node, webhook on and off, side by side in one run.

The command; the code is gpu_stack_dev.bench.pod_startup."""

import sys

from gpu_stack_dev.bench.pod_startup import main

if __name__ == "__main__":
    sys.exit(main())
