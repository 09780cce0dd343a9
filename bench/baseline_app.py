#!/usr/bin/env python3
"""The allow-all baseline of `make bench`: the cost of serving an AdmissionReview at all.

The command; the code is gpu_stack_dev.bench.baseline_app."""

import sys

from gpu_stack_dev.bench.baseline_app import main

if __name__ == "__main__":
    sys.exit(main())
