#!/usr/bin/env python3
"""Scale benchmark of `kubectl gpu-stack inspect --usage --idle` against a real Prometheus: 1,000 GPU nodes and
8,000 GPU pods (gpu_stack_dev.bench.inspect_usage says how).

    .venv/bin/python bench/inspect_usage.py --kubeconfig K [--rounds 3] [--report]

`make bench-inspect` runs it on a throwaway control plane of its own after bench/inspect_scale.py; --report puts
its figures at the end of that benchmark's section (bench/inspect-scale.md and BENCHMARKS.md)."""

import argparse
import os
import sys
from pathlib import Path

from gpu_stack_dev.bench.inspect_usage import add_to_report, check, measure, report_lines

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", type=Path, default=os.environ.get("KUBECONFIG"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--report", action="store_true",
                        help="add the figures to bench/inspect-scale.md and BENCHMARKS.md")
    args = parser.parse_args()
    if not args.kubeconfig:
        parser.error("--kubeconfig or KUBECONFIG is required")
    created, runs, lines = measure(args.kubeconfig, args.rounds)
    text = report_lines(created, runs, lines)
    print("\n".join(text))
    wrong = check(runs)
    if wrong:
        print(wrong, file=sys.stderr)
        sys.exit(1)
    if args.report:
        add_to_report(text)
