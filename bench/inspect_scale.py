#!/usr/bin/env python3
"""Scale benchmark of `kubectl gpu-stack inspect`: N GPU nodes and M pods created through a real API
server, then the command timed (wall clock of the whole process, and the API part it reports with -v)
and its request count taken from its own -v line.

The command; the code is gpu_stack_dev.bench.inspect_scale."""

import sys

from gpu_stack_dev.bench.inspect_scale import main

if __name__ == "__main__":
    sys.exit(main())
