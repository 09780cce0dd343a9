#!/usr/bin/env python3
"""`make bench`, pod creation through a real API server: our webhooks vs a bare allow-all.

The command; the code is gpu_stack_dev.bench.apiserver_load."""

import sys

from gpu_stack_dev.bench.apiserver_load import main

if __name__ == "__main__":
    sys.exit(main())
