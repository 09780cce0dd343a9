#!/usr/bin/env python3
"""python hack/controlplane.py run [--keep] -- CMD [ARG...]: CMD against a throwaway control plane
(gpu_stack_dev.controlplane says how)."""

import sys

from gpu_stack_dev.controlplane import main

if __name__ == "__main__":
    sys.exit(main())
