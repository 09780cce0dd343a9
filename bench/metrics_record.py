#!/usr/bin/env python3
"""In-process micro-benchmark of `Metrics.record` (not part of the test suite, not run by `make bench`).

The command; the code is gpu_stack_dev.bench.metrics_record."""

from gpu_stack_dev.bench.metrics_record import main

if __name__ == "__main__":
    main()
