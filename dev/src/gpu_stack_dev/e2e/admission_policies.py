"""Waiting for the API server's admission policy plugin to let go of a release's CEL policies. It loads
ValidatingAdmissionPolicies and their bindings through informers, one event at a time, so they stop being
enforced a little after `helm uninstall` deleted them: a release installed meanwhile would still be judged by
bindings that excluded only the old release's namespace (its own DaemonSets refused for
NVIDIA_VISIBLE_DEVICES in an init container, say)."""

from __future__ import annotations

import json
import time
from typing import Any

from .e2elib import E2ECluster


def _probe(name: str, **container: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": {"nvidia.com/gpu": 1}}, **container}]}}


# What the chart's policies refuse in every layout: the variable (GPU002) and a privileged GPU pod (GPU003).
PROBES = (_probe("probe-env", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
          _probe("probe-privileged", securityContext={"privileged": True}))


def wait_not_enforced(cluster: E2ECluster, timeout: float = 60) -> None:
    """Until a dry-run create of every probe in a fresh namespace meets no ValidatingAdmissionPolicy."""
    namespace = cluster.create_namespace()
    deadline = time.monotonic() + timeout
    try:
        for probe in PROBES:
            while "ValidatingAdmissionPolicy" in (proc := cluster.kubectl(
                    "create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(probe),
                    check=False)).stderr:
                assert time.monotonic() < deadline, f"the policies are still enforced after uninstall: {proc.stderr}"
                time.sleep(0.5)
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
