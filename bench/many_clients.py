#!/usr/bin/env python3
"""`make bench`, many keep-alive clients: N persistent TLS clients with silent connections mixed in.

The command; the code is gpu_stack_dev.bench.many_clients."""

import sys

from gpu_stack_dev.bench.many_clients import main

if __name__ == "__main__":
    sys.exit(main())
