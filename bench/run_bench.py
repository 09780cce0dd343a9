#!/usr/bin/env python3
"""`make bench`, the HTTP part: the webhook as deployed vs an allow-all baseline, over TLS, with wrk.

The command; the code is gpu_stack_dev.bench.run_bench."""

import sys

from gpu_stack_dev.bench.run_bench import main

if __name__ == "__main__":
    sys.exit(main())
