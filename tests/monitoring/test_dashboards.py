"""The chart's Grafana dashboards (monitoring.dashboards): generated from
gpu_stack_dev/generate/monitoring/dashboards.py with
grafana-foundation-sdk, shipped as ConfigMaps for Grafana's dashboard sidecar, every query parsed by promtool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_dev.chartlib import find, render, run_helm, template_args
from gpu_stack_dev.generate.monitoring import dashboards, placeholders

from .promlib import DASHBOARDS_ON, panel_queries, rendered_dashboards, run_promtool

UIDS = {"gpu-stack-gpu-fleet", "gpu-stack-sharing", "gpu-stack-admission"}


def rule_file(directory: Path, exprs: list[str]) -> Path:
    """One recording rule per expression: `promtool check rules` parses each with Prometheus' own parser."""
    rules = [{"record": f"gpu_stack:dashboard_query_{i}", "expr": expr} for i, expr in enumerate(exprs)]
    path = directory / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}), encoding="utf-8")
    return path


def all_queries() -> list[tuple[str, str, str]]:
    return [(uid, title, expr) for uid, board in rendered_dashboards().items() for title, expr in panel_queries(board)]


def test_off_by_default() -> None:
    names = [o["metadata"]["name"] for o in find(render(3).objects(), "ConfigMap")]
    assert [n for n in names if "dashboard" in n] == []


def test_one_configmap_per_dashboard_labelled_for_the_sidecar_with_the_folder() -> None:
    maps = [o for o in find(render(3, "default", DASHBOARDS_ON).objects(), "ConfigMap")
            if "dashboard" in o["metadata"]["name"]]
    assert sorted(o["metadata"]["name"] for o in maps) == [
        "t-gpu-stack-dashboard-admission", "t-gpu-stack-dashboard-gpu-fleet", "t-gpu-stack-dashboard-sharing"]
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU"}
        assert cm["metadata"]["namespace"] == "gpu-stack"
        (key,) = cm["data"]
        assert key == f"{json.loads(cm['data'][key])['uid']}.json"


def test_namespace_folder_and_labels_are_settable() -> None:
    settings = {**DASHBOARDS_ON, "monitoring.dashboards.namespace": "monitoring",
                "monitoring.dashboards.folder": "",
                "monitoring.dashboards.labels": {"dashboards": "gpu", "grafana_dashboard": None}}
    maps = [o for o in find(render(3, "default", settings).objects(), "ConfigMap")
            if "dashboard" in o["metadata"]["name"]]
    assert len(maps) == 3
    for cm in maps:
        assert cm["metadata"]["namespace"] == "monitoring"
        assert "annotations" not in cm["metadata"]
        assert cm["metadata"]["labels"]["dashboards"] == "gpu" and "grafana_dashboard" not in cm["metadata"]["labels"]


def test_the_three_dashboards_with_their_panels() -> None:
    boards = rendered_dashboards()
    assert set(boards) == UIDS
    titles = {uid: {p["title"] for p in board["panels"]} for uid, board in boards.items()}
    assert {"GPU utilisation", "Framebuffer used", "Framebuffer free", "Temperature", "Power", "Last XID error",
            "GPUs and their pods"} <= titles["gpu-stack-gpu-fleet"]
    assert {"Requested vs advertised, per node and resource", "Pods per GPU", "About attribution",
            "MIG instance activity (graphics engine)"} <= titles["gpu-stack-sharing"]
    assert {"Reviews by endpoint and outcome", "Denials by rule", "Webhook latency (its own histogram)",
            "Call latency seen by the API server", "Rejections by error type", "Fail-open calls"} <= titles[
        "gpu-stack-admission"]


def test_every_panel_says_no_data_and_queries_the_chosen_prometheus() -> None:
    for board in rendered_dashboards().values():
        assert [v["name"] for v in board["templating"]["list"]] == ["datasource"]
        for panel in board["panels"]:
            if panel["type"] in ("row", "text"):
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["fieldConfig"]["defaults"]["noValue"] == "No data", panel["title"]
            assert panel["targets"], panel["title"]


def test_panels_fit_the_grid_without_overlapping() -> None:
    for uid, board in rendered_dashboards().items():
        cells: dict[tuple[int, int], str] = {}
        for panel in board["panels"]:
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24, (uid, panel["title"])
            for x in range(pos["x"], pos["x"] + pos["w"]):
                for y in range(pos["y"], pos["y"] + pos["h"]):
                    assert (x, y) not in cells, (uid, panel["title"], cells.get((x, y)))
                    cells[(x, y)] = panel["title"]


def test_approximate_attribution_is_said_on_the_panels() -> None:
    sharing = rendered_dashboards()["gpu-stack-sharing"]
    panels = {p["title"]: p for p in sharing["panels"]}
    assert panels["Pods per GPU"]["description"].startswith("Approximate")
    assert "Attribution is approximate" in panels["About attribution"]["options"]["content"]


def test_dcgm_queries_take_either_label_spelling() -> None:
    """The Kubernetes mapping's labels whether Prometheus kept them (honorLabels) or renamed them, and the
    hostname label in either case."""
    fleet = dict(panel_queries(rendered_dashboards()["gpu-stack-gpu-fleet"]))
    expr = fleet["GPU utilisation"]
    for source in ("exported_pod", "exported_namespace", "hostname"):
        assert f'"{source}", "(.+)"' in expr


def test_every_query_parses(tmp_path: Path) -> None:
    queries = all_queries()
    assert len(queries) >= 25
    result = run_promtool("check", "rules", str(rule_file(tmp_path, [expr for _, _, expr in queries])))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


@pytest.mark.parametrize("broken", ["sum by (node (up)", 'up{job="x"', "rate(up[5m)"])
def test_the_parse_check_catches_a_broken_query(tmp_path: Path, broken: str) -> None:
    exprs = [expr for _, _, expr in all_queries()] + [broken]
    assert run_promtool("check", "rules", str(rule_file(tmp_path, exprs))).returncode != 0


def test_rendered_dashboards_keep_no_placeholder() -> None:
    text = json.dumps(rendered_dashboards())
    assert [p for p in placeholders.ALL if p in text] == []
    assert 'up{job=\\"t-gpu-stack-webhook\\", namespace=\\"gpu-stack\\"}' in text


def test_layout_is_the_description() -> None:
    """The generated JSON is the description, panel for panel, in order."""
    for description in dashboards.DASHBOARDS:
        built: dict[str, Any] = dashboards.build(description)
        titles = [p["title"] for p in built["panels"] if p["type"] != "row"]
        assert titles == [p.title for p in description.panels()]
        rows = [p["title"] for p in built["panels"] if p["type"] == "row"]
        assert rows == [title for title, _ in description.rows]


GRAFANA_OPERATOR_API = ["--api-versions", "grafana.integreatly.org/v1beta1/GrafanaDashboard"]


@pytest.mark.parametrize(("dashboards", "operator", "served", "expected"), [
    (True, "auto", True, 3), (True, "auto", False, 0), (True, True, False, 3), (True, False, True, 0),
    (False, "auto", True, 0)])
def test_grafana_operator_dashboards_when_served_or_forced(dashboards: bool, operator: object, served: bool,
                                                           expected: int) -> None:
    settings = {"monitoring.dashboards.enabled": dashboards, "monitoring.dashboards.grafanaOperator.enabled": operator}
    result = run_helm(3, template_args(set_json=settings) + (GRAFANA_OPERATOR_API if served else []))
    assert len(find(result.objects(), "GrafanaDashboard")) == expected


def test_grafana_operator_dashboards_carry_the_same_json_the_folder_and_the_selector() -> None:
    objects = run_helm(3, template_args(set_json=DASHBOARDS_ON) + GRAFANA_OPERATOR_API).objects()
    maps = {o["metadata"]["name"]: o for o in find(objects, "ConfigMap") if "dashboard" in o["metadata"]["name"]}
    for obj in find(objects, "GrafanaDashboard"):
        (text,) = maps[obj["metadata"]["name"]]["data"].values()
        assert json.loads(obj["spec"]["json"]) == json.loads(text)
        assert obj["spec"]["folder"] == "GPU"
        assert obj["spec"]["instanceSelector"] == {"matchLabels": {"dashboards": "grafana"}}
