#!/usr/bin/env python3
"""`make soak`: the webhook under steady load for a long time, at half of its measured capacity.

The command; the code is gpu_stack_dev.bench.soak."""

import sys

from gpu_stack_dev.bench.soak import main

if __name__ == "__main__":
    sys.exit(main())
