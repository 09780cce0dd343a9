"""Shared helpers of the monitoring tests: promtool (hack/ensure-promtool.sh) and the chart's rendered
PrometheusRule as a promtool rule file."""

from __future__ import annotations

import json
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from gpu_stack_dev.chartlib import ROOT, one, render

HERE = Path(__file__).resolve().parent
FORCED = {"monitoring.prometheusRule.enabled": True}


@cache
def promtool() -> str:
    out = subprocess.run([str(ROOT / "hack" / "ensure-promtool.sh")], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False)


def rendered_rules(set_json: dict[str, Any] | None = None, overlay: str = "default") -> dict[str, Any]:
    """spec of the PrometheusRule `helm template t charts/gpu-stack --namespace gpu-stack` renders."""
    objects = render(3, overlay, {**FORCED, **(set_json or {})}).objects()
    return one(objects, "PrometheusRule", "t-gpu-stack-alerts")["spec"]


def write_rules(directory: Path, spec: dict[str, Any], name: str = "rules.yaml") -> Path:
    path = directory / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


DASHBOARDS_ON = {"monitoring.dashboards.enabled": True}


def rendered_dashboards(set_json: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """uid -> dashboard JSON of the ConfigMaps `helm template t charts/gpu-stack --namespace gpu-stack` renders."""
    out = {}
    for obj in render(3, "default", {**DASHBOARDS_ON, **(set_json or {})}).objects():
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"].startswith("t-gpu-stack-dashboard-"):
            for text in obj["data"].values():
                board = json.loads(text)
                out[board["uid"]] = board
    return out


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel."""
    return [(panel["title"], target["expr"]) for panel in board["panels"] for target in panel.get("targets", [])]
