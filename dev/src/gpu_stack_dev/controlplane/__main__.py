"""python -m gpu_stack_dev.controlplane run -- CMD (the package docstring)."""

import sys

from gpu_stack_dev.controlplane import main

sys.exit(main())
