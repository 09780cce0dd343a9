"""RBAC of the whole chart, defaults and every overlay: no wildcards, no cluster-wide Secret access, and
the chart README lists every permission per ServiceAccount (hack/chart-rbac-table.py --check)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from gpu_stack_dev.chartlib import ROOT, overlays, render

OVERLAYS = overlays()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_wildcards_and_no_cluster_wide_secrets(overlay: str) -> None:
    for obj in render(3, overlay).objects():
        if obj["kind"] not in ("Role", "ClusterRole"):
            continue
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        assert "aggregationRule" not in obj, name
        for rule in obj.get("rules") or []:
            for key in ("verbs", "resources", "apiGroups", "resourceNames", "nonResourceURLs"):
                assert "*" not in (rule.get(key) or []), f"{name}: wildcard in {key}: {rule}"
            if obj["kind"] == "ClusterRole":
                assert "secrets" not in rule.get("resources", []), f"{name} grants Secrets cluster-wide: {rule}"


def test_readme_rbac_table_is_current() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "hack" / "chart-rbac-table.py"), "--check"],
                          capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr
