"""RBAC of the whole chart, defaults and every overlay: no wildcards, no cluster-wide Secret access (the chart README's
table of every permission per ServiceAccount is generated: tests/test_generated.py)."""

from __future__ import annotations

import pytest
from gpu_stack_dev.chartlib import overlays, render

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

