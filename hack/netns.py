#!/usr/bin/env python3
"""python hack/netns.py run -- CMD [ARG...] | check: CMD in network and mount namespaces of its own
(gpu_stack_dev.netns says how)."""

import sys

from gpu_stack_dev.netns import main

if __name__ == "__main__":
    sys.exit(main())
