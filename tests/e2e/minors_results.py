"""What `make e2e` found on each Kubernetes minor: kubernetes-minors.json beside this file, which `make generate`
renders as the support table (gpu_stack_dev.generate.support_table). A test calls `record(minor, key, outcome)`:
the outcome must be the recorded one; with GPU_STACK_E2E_RECORD=1 it is written there instead (after a deliberate
change; then `make generate`)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from gpu_stack_dev.e2e.e2elib import E2ECluster

RESULTS = Path(__file__).with_name("kubernetes-minors.json")
RECORD = os.environ.get("GPU_STACK_E2E_RECORD") == "1"


def recorded() -> dict[str, Any]:
    out: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    return out


def write(minor: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Change this minor's entry of the results file as it is now (another minor's run may have written it)."""
    current = recorded()
    change(current.setdefault(minor, {}))
    RESULTS.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")


def record(minor: str, key: str, outcome: str) -> None:
    """The outcome is the one kubernetes-minors.json holds (GPU_STACK_E2E_RECORD=1: write it there)."""
    if RECORD:
        write(minor, lambda entry: entry.setdefault("results", {}).__setitem__(key, outcome))
        return
    want = recorded().get(minor, {}).get("results", {}).get(key)
    assert outcome == want, (f"Kubernetes {minor}, {key}: {outcome!r}, but {RESULTS.name} records {want!r} "
                             "(a deliberate change: GPU_STACK_E2E_RECORD=1, then make generate)")


@cache
def _session_minor(kubeconfig: str, kubectl: str) -> str:
    import subprocess  # noqa: PLC0415

    out = subprocess.run([kubectl, "version", "-o", "json"], capture_output=True, text=True, check=True,
                         env={**os.environ, "KUBECONFIG": kubeconfig})
    server = json.loads(out.stdout)["serverVersion"]
    return f"{server['major']}.{server['minor'].rstrip('+')}"


def record_session(cluster: E2ECluster, key: str, outcome: str) -> None:
    """For the modules that run on the session's throwaway plane (1.36): its column of the table. Nothing on an
    existing cluster (its version is not the suite's)."""
    if cluster.kind != "envtest":
        return
    record(_session_minor(str(cluster.kubeconfig), cluster.kubectl_bin), key, outcome)
