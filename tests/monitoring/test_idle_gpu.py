"""Idle allocated GPUs (monitoring.idleGpu): the thresholds reach the rendered alert GPUStackGPUAllocatedIdle and
the fleet dashboard's idle panels, promtool evaluates both on series shaped like dcgm-exporter's, the schema and a
render-time check reject thresholds that cannot work, and `enabled: false` leaves the alert out.
The alert's own firing and quiet cases at the defaults are in alerts.test.yaml."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_dev.chartlib import run_helm, template_args
from gpu_stack_dev.generate.monitoring import alerts

from .promlib import FORCED, HERE, panel_queries, rendered_dashboards, rendered_rules, run_promtool, write_rules

ALERT = "GPUStackGPUAllocatedIdle"
UNIT_TESTS = HERE / "alerts.test.yaml"
JOB = "t-gpu-stack-dcgm-exporter"


def _rules(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in spec["groups"] for rule in group["rules"]}


def _util(gpu: str, pod: str, values: str, namespace: str = "ml") -> dict[str, str]:
    """A DCGM_FI_DEV_GPU_UTIL series as dcgm-exporter writes it for a GPU a pod holds, with the target's labels."""
    return {"series": f'DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu[-1]}", UUID="{gpu}", Hostname="node-a", job="{JOB}", '
                      f'instance="10.0.1.1:9400", namespace="{namespace}", pod="{pod}", container="c"}}',
            "values": values}


# The exporter's own target, and a GPU no pod holds (the target's pod label on it).
EXPORTER = [{"series": f'up{{job="{JOB}", namespace="gpu-stack", pod="dcgm-a", instance="10.0.1.1:9400"}}',
             "values": "1x70"},
            {"series": f'DCGM_FI_DEV_GPU_UTIL{{gpu="9", UUID="GPU-9", Hostname="node-a", job="{JOB}", '
                       'instance="10.0.1.1:9400", namespace="gpu-stack", pod="dcgm-a", container="dcgm-exporter"}',
             "values": "0x70"}]


def _promtool_test(tmp_path: Path, spec: dict[str, Any], tests: list[dict[str, Any]]) -> str:
    write_rules(tmp_path, spec)
    (tmp_path / "idle.test.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}), encoding="utf-8")
    result = run_promtool("test", "rules", "idle.test.yaml", cwd=tmp_path)
    return result.stdout + result.stderr if result.returncode else ""


def test_the_thresholds_reach_the_rule() -> None:
    rule = _rules(rendered_rules({"monitoring.idleGpu": {"utilizationPercentBelow": 12.5, "window": "2h",
                                                         "severity": "critical"}}))[ALERT]
    assert rule["expr"].endswith(") < 12.5")
    assert rule["for"] == "2h"
    assert rule["labels"] == {"severity": "critical"}
    assert rule["annotations"]["summary"] == "A pod holds GPUs that have been under 12.5% busy for 2h."
    assert '"hostname", "(.+)") unless on (job, instance, pod) up)' in rule["expr"]


def test_other_thresholds_fire_where_the_defaults_would_not(tmp_path: Path) -> None:
    """At 50% and 10m a pod at 30% fires after 10 minutes; the default rule (5%, 30m) stays quiet on it."""
    series = [*EXPORTER, _util("GPU-1", "half-idle", "30x40"), _util("GPU-2", "busy", "60x40")]
    fired = {"exp_labels": {"severity": "warning", "namespace": "ml", "pod": "half-idle", "Hostname": "node-a"},
             "exp_annotations": {
                 "summary": "A pod holds GPUs that have been under 50% busy for 10m.",
                 "description": "Pod ml/half-idle on node-a holds GPUs (whole, MIG or shared) whose utilisation has "
                                "stayed under 50% for 10m (the busiest is at 30%): no other workload can be scheduled "
                                "on them. A shared GPU counts only while every pod on it is idle.",
                 "runbook_url": "https://github.com/gpu-stack/gpu-stack/blob/main/docs/runbooks/"
                                "GPUStackGPUAllocatedIdle.md"}}
    tests = [{"interval": "1m", "input_series": series, "alert_rule_test": [
        {"eval_time": "9m", "alertname": ALERT, "exp_alerts": []},
        {"eval_time": "11m", "alertname": ALERT, "exp_alerts": [fired]}]}]
    spec = rendered_rules({"monitoring.idleGpu": {"utilizationPercentBelow": 50, "window": "10m"}})
    failed = _promtool_test(tmp_path, spec, tests)
    assert not failed, failed
    # The default rule fails the same test: the values are what decides.
    assert ALERT in _promtool_test(tmp_path, rendered_rules(), tests)


def test_disabled_leaves_out_only_the_idle_alert(tmp_path: Path) -> None:
    spec = rendered_rules({"monitoring.idleGpu.enabled": False})
    names = set(_rules(spec))
    assert names == {a.name for a in alerts.alerts()} - {ALERT}
    assert [g["name"] for g in spec["groups"]] == ["gpu-stack-webhook", "gpu-stack-gpus"]
    assert _rules(spec) == {name: rule for name, rule in _rules(rendered_rules()).items() if name != ALERT}
    result = run_promtool("check", "rules", str(write_rules(tmp_path, spec)))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_unit_tests_catch_a_gpu_nobody_holds(tmp_path: Path) -> None:
    """Without the guard against the target's own pod label, alerts.test.yaml fails on the GPU no pod holds."""
    spec = rendered_rules()
    for group in spec["groups"]:
        for rule in group["rules"]:
            rule["expr"] = rule["expr"].replace(" unless on (job, instance, pod) up)", ")")
    write_rules(tmp_path, spec)
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    result = run_promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert result.returncode != 0 and 'pod="dcgm-a"' in result.stdout + result.stderr


@pytest.mark.parametrize(("values", "message"), [
    ({"utilizationPercentBelow": 0}, "utilizationPercentBelow"),
    ({"utilizationPercentBelow": -5}, "utilizationPercentBelow"),
    ({"utilizationPercentBelow": 101}, "utilizationPercentBelow"),
    ({"utilizationPercentBelow": "5"}, "utilizationPercentBelow"),
    ({"window": "30"}, "window"),
    ({"window": "0m"}, "window"),
    ({"window": "90s"}, "window"),
    ({"window": "1h30m"}, "window"),
    ({"window": ""}, "window"),
    ({"severity": "page"}, "severity"),
    ({"threshold": 5}, "threshold"),
])
def test_the_schema_rejects_thresholds_that_cannot_work(values: dict[str, Any], message: str) -> None:
    result = run_helm(3, template_args(set_json={**FORCED, "monitoring.idleGpu": values}))
    assert not result.ok
    assert "values don't meet the specifications of the schema" in result.stderr and message in result.stderr


@pytest.mark.parametrize("window", ["1m", "4m"])
def test_a_window_under_five_minutes_stops_the_render(window: str) -> None:
    result = run_helm(3, template_args(set_json={"monitoring.idleGpu.window": window}))
    assert not result.ok
    assert f'gpu-stack: monitoring.idleGpu.window "{window}" is under 5m' in result.stderr


@pytest.mark.parametrize("window", ["5m", "90m", "2h", "1d"])
def test_windows_of_five_minutes_and_more_render(window: str) -> None:
    assert _rules(rendered_rules({"monitoring.idleGpu.window": window}))[ALERT]["for"] == window


def _idle_panels(set_json: dict[str, Any] | None = None) -> dict[str, str]:
    fleet = rendered_dashboards(set_json)["gpu-stack-gpu-fleet"]
    return {title: expr for title, expr in panel_queries(fleet) if "idle" in title.lower()}


def test_the_dashboard_panels_take_the_thresholds() -> None:
    panels = _idle_panels({"monitoring.idleGpu": {"utilizationPercentBelow": 20, "window": "2h"}})
    assert set(panels) == {"Idle allocated GPUs", "Idle allocated GPUs by pod", "GPU-hours idle by namespace, last 24h",
                           "GPU-hours idle by pod, last 24h"}
    for title, expr in panels.items():
        assert "[2h:" in expr and "offset 2h" in expr and ") < 20 and " in expr, title
    fleet = rendered_dashboards({"monitoring.idleGpu": {"utilizationPercentBelow": 20, "window": "2h"}})[
        "gpu-stack-gpu-fleet"]
    described = {p["title"]: p.get("description", "") for p in fleet["panels"]}
    assert "under 20% busy for 2h" in described["Idle allocated GPUs"]


def test_the_dashboard_queries_on_exporter_series(tmp_path: Path) -> None:
    """promtool evaluates the panels' queries at the defaults (5%, 30m) at minute 60: GPU-1 idle throughout, GPU-2
    busy, GPU-3 shared by two idle pods (one device, two pods), GPU-4 held only since minute 45 (idle, but not for
    the window yet), GPU-9 held by nobody."""
    panels = _idle_panels()
    series = [*EXPORTER, _util("GPU-1", "notebook", "1x70"), _util("GPU-2", "train", "80x70"),
              _util("GPU-3", "left-open", "0x70", "team-b"), _util("GPU-3", "sleeping", "0x70", "team-b"),
              _util("GPU-4", "new", "_x44 0x25")]
    pod = {"namespace": "ml", "Hostname": "node-a"}
    shared = {"namespace": "team-b", "Hostname": "node-a"}
    cases = [
        (panels["Idle allocated GPUs"], [{"labels": "{}", "value": 2}]),
        (panels["Idle allocated GPUs by pod"], [
            {"labels": json.dumps({**pod, "pod": "notebook"}), "value": 1},
            {"labels": json.dumps({**shared, "pod": "left-open"}), "value": 1},
            {"labels": json.dumps({**shared, "pod": "sleeping"}), "value": 1}]),
        # Idle for the window from minute 30 on: the 5-minute steps 30, 35, ..., 60 count: 7 x 5 minutes.
        (panels["GPU-hours idle by namespace, last 24h"], [
            {"labels": '{namespace="ml"}', "value": 7 * 5 / 60},
            {"labels": '{namespace="team-b"}', "value": 2 * 7 * 5 / 60}]),
    ]
    tests = [{"interval": "1m", "input_series": series, "promql_expr_test": [
        {"expr": expr, "eval_time": "60m", "exp_samples": [
            {"labels": _labels(sample["labels"]), "value": sample["value"]} for sample in samples]}
        for expr, samples in cases]}]
    failed = _promtool_test(tmp_path, {"groups": []}, tests)
    assert not failed, failed


def _labels(text: str) -> str:
    """A label set in PromQL's notation ({a="b", ...}) from JSON or as given."""
    if not text.startswith('{"'):
        return text
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(json.loads(text).items())) + "}"
