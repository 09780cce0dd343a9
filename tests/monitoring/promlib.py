"""Shared helpers of the monitoring tests: promtool (hack/ensure-promtool.sh) and the chart's rendered
PrometheusRule as a promtool rule file."""

from __future__ import annotations

import json
import re
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


def ksm_node_status_series(node: dict[str, Any]) -> dict[str, float]:
    """The kube_node_status_capacity/allocatable series kube-state-metrics v2.20.0 exports for a Node object's
    extended resources (internal/store/node.go createNodeStatusCapacityFamilyGenerator and
    createNodeStatusAllocatableFamilyGenerator: status.capacity/allocatable, the resource name through
    SanitizeLabelName (every character not allowed in a label name becomes `_`), unit `integer` for an
    extended resource; the job label as the chart's unit tests name it: the alerts do not read it). CPU, memory,
    pods and the like are left out."""
    name = node["metadata"]["name"]
    out = {}
    for metric, field in (("kube_node_status_capacity", "capacity"), ("kube_node_status_allocatable", "allocatable")):
        for resource, quantity in node["status"].get(field, {}).items():
            if "/" not in resource or resource.startswith(("kubernetes.io/", "hugepages-")):
                continue
            label = re.sub(r"[^a-zA-Z0-9_]", "_", resource)
            series = f'{metric}{{node="{name}", resource="{label}", unit="integer", job="kube-state-metrics"}}'
            out[series] = float(quantity)
    return out


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
