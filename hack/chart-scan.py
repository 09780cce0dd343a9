#!/usr/bin/env python3
"""Scan the rendered chart with checkov (Kubernetes framework): the defaults, every overlay in
Chart-values-examples/ and a render with a helm test namespace. Fails on any failed check, on a parsing
error, and on any skipped check that is not declared with a reason for a check ALLOWED to be skipped
(gpu_stack_dev.generate.chart_security). Prints passed / skipped / failed per scenario and failed checks per workload.

    hack/chart-scan.py [--checkov PATH]      (default: hack/ensure-checkov.sh installs checkov 3.3.30)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from gpu_stack_dev.generate import chart_security as security

ROOT = Path(__file__).resolve().parents[1]


def checkov_path() -> str:
    out = subprocess.run([str(ROOT / "hack" / "ensure-checkov.sh")], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def scan(checkov: str, directory: Path) -> list[dict[str, Any]]:
    proc = subprocess.run([checkov, "--directory", str(directory), "--framework", "kubernetes", "--output", "json",
                           "--compact", "--skip-download"], check=False, capture_output=True, text=True)
    if proc.returncode not in (0, 1):  # 1: failed checks, judged below
        sys.exit(f"checkov exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    report = json.loads(proc.stdout)
    return report if isinstance(report, list) else [report]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkov", help="checkov binary (default: the tool venv of hack/ensure-checkov.sh)")
    args = parser.parse_args()
    checkov = args.checkov or checkov_path()
    helm = security.helm()
    problems: list[str] = []
    workloads: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-stack-scan-") as tmp:
        for name, extra in security.scenarios().items():
            manifest = security.render(helm, extra)
            (Path(tmp) / f"{name}.yaml").write_text(manifest)
            workloads[name] = sum(1 for o in security.objects(manifest) if o.get("kind") in security.WORKLOAD_KINDS)
        reports = scan(checkov, Path(tmp))
    counts: dict[str, Counter[str]] = {name: Counter() for name in workloads}
    failed_by_workload: Counter[str] = Counter()
    for report in reports:
        if report.get("check_type") not in (None, "kubernetes"):
            continue
        if report["summary"].get("parsing_errors"):
            problems.append(f"checkov could not parse: {report['results'].get('parsing_errors')}")
        for outcome in ("passed", "failed", "skipped"):
            for result in report["results"].get(f"{outcome}_checks", []):
                scenario = Path(result["file_path"]).stem
                counts[scenario][outcome] += 1
                where = f"{scenario}: {result['resource']} {result['check_id']}"
                if outcome == "failed":
                    failed_by_workload[result["resource"]] += 1
                    problems.append(f"FAILED {where} ({result['check_name']})")
                elif outcome == "skipped":
                    comment = (result.get("check_result") or {}).get("suppress_comment") or ""
                    if result["check_id"] not in security.ALLOWED:
                        problems.append(f"skip of a check that is not an allowed exception: {where}")
                    if not comment.strip() or comment == "No comment provided":
                        problems.append(f"skip without a reason: {where}")
    print(f"checkov on the rendered chart (release {security.RELEASE}):")
    print(f"{'scenario':36} {'workloads':>9} {'passed':>7} {'skipped':>8} {'failed':>7} {'failed/workload':>16}")
    for name, count in counts.items():
        per = count["failed"] / workloads[name] if workloads[name] else 0.0
        print(f"{name:36} {workloads[name]:9} {count['passed']:7} {count['skipped']:8} {count['failed']:7} {per:16.1f}")
    for problem in problems[:50]:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{len(problems)} problem(s); failed checks by object: {dict(failed_by_workload)}", file=sys.stderr)
        return 1
    print("0 failed checks; every skip is a declared exception with a reason.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
