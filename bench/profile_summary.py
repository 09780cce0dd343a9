#!/usr/bin/env python3
"""Summarise py-spy's collapsed stacks (`py-spy record -f raw`): where a worker's busy time goes.

The command; the code is gpu_stack_dev.bench.profile_summary."""

from gpu_stack_dev.bench.profile_summary import main

if __name__ == "__main__":
    main()
