#!/usr/bin/env python3
"""The API server's own time evaluating the chart's matchConditions against a constant `false`, one pod
create at a time; `--against REV` measures that revision's conditions beside this checkout's.

The command; the code is gpu_stack_dev.bench.match_conditions_cost."""

import sys

from gpu_stack_dev.bench.match_conditions_cost import main

if __name__ == "__main__":
    sys.exit(main())
