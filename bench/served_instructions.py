#!/usr/bin/env python3
"""`make bench`, instructions per served review: the webhook and the allow-all under valgrind's callgrind.

The command; the code is gpu_stack_dev.bench.served_instructions."""

import sys

from gpu_stack_dev.bench.served_instructions import main

if __name__ == "__main__":
    sys.exit(main())
