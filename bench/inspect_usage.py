#!/usr/bin/env python3
"""Scale benchmark of `kubectl gpu-stack inspect --usage --idle` against a real Prometheus: 1,000 GPU nodes and
8,000 GPU pods. `make bench-inspect` runs it as part of bench/inspect_scale.py (its figures go in the same
section of BENCHMARKS.md); alone: .venv/bin/python bench/inspect_usage.py --kubeconfig K.

The code is gpu_stack_dev.bench.inspect_usage."""

import argparse
import os
import sys
from pathlib import Path

from gpu_stack_dev.bench.inspect_usage import measure, report_lines

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", type=Path, default=os.environ.get("KUBECONFIG"))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not args.kubeconfig:
        parser.error("--kubeconfig or KUBECONFIG is required")
    created, runs, lines = measure(args.kubeconfig, args.rounds)
    print("\n".join(report_lines(created, runs, lines)))
    sys.exit(0)
