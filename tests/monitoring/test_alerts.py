"""The chart's alerts (monitoring.prometheusRule): generated from
gpu_stack_dev/generate/monitoring/alerts.py, rendered as a
PrometheusRule when the API is served or forced, checked and unit-tested by the real promtool (Debian's
prometheus package, hack/ensure-promtool.sh) on what the chart renders."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_dev.chartlib import ROOT, find, one, render, run_helm, template_args
from gpu_stack_dev.generate.monitoring import alerts, placeholders

from .promlib import HERE, rendered_rules, run_promtool, write_rules

UNIT_TESTS = HERE / "alerts.test.yaml"
RUNBOOK_BASE = "https://github.com/gpu-stack/gpu-stack/blob/main/docs/runbooks/"
RULE_API = ["--api-versions", "monitoring.coreos.com/v1/PrometheusRule"]


def _rules(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in spec["groups"] for rule in group["rules"]]


def test_promtool_checks_the_rendered_rules(tmp_path: Path) -> None:
    result = run_promtool("check", "rules", str(write_rules(tmp_path, rendered_rules())))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts.alerts())} rules found" in result.stdout


def test_promtool_check_rejects_a_broken_expression(tmp_path: Path) -> None:
    spec = rendered_rules()
    spec["groups"][0]["rules"][0]["expr"] = "up{job=="
    result = run_promtool("check", "rules", str(write_rules(tmp_path, spec)))
    assert result.returncode != 0


def test_promtool_unit_tests_pass(tmp_path: Path) -> None:
    write_rules(tmp_path, rendered_rules())
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    result = run_promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_fail_on_other_rules(tmp_path: Path) -> None:
    """The unit tests pin the thresholds: a rule file with another temperature limit fails them."""
    spec = rendered_rules()
    for rule in _rules(spec):
        rule["expr"] = rule["expr"].replace(f"> {alerts.GPU_TEMPERATURE_CELSIUS}", "> 95")
    write_rules(tmp_path, spec)
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    result = run_promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert result.returncode != 0 and "GPUStackGPUTemperatureHigh" in result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    cases = [case for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    for alert in alerts.alerts():
        mine = [case for case in cases if case["alertname"] == alert.name]
        assert any(case["exp_alerts"] for case in mine), f"{alert.name}: no test where it fires"
        assert any(not case["exp_alerts"] for case in mine), f"{alert.name}: no test where it stays quiet"
    assert {case["alertname"] for case in cases} == {a.name for a in alerts.alerts()}


def test_every_alert_has_severity_summary_description_and_a_runbook_in_the_repository() -> None:
    for rule in _rules(rendered_rules()):
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], rule["alert"]
        assert annotations["runbook_url"] == f"{RUNBOOK_BASE}{rule['alert']}.md"
        runbook = ROOT / "docs" / "runbooks" / f"{rule['alert']}.md"
        assert runbook.is_file(), f"{runbook} is missing"
        assert runbook.read_text(encoding="utf-8").startswith(f"# {rule['alert']}\n"), runbook


def test_rendered_rules_keep_no_placeholder() -> None:
    text = yaml.safe_dump(rendered_rules())
    assert [p for p in placeholders.ALL if p in text] == []


def test_placeholders_take_the_release_and_values() -> None:
    spec = rendered_rules({"webhook.timeoutSeconds": 20, "monitoring.prometheusRule.webhookLatencyRatio": 0.75,
                           "monitoring.jobs": {"webhook": "wh", "dcgmExporter": "dcgm"},
                           "monitoring.prometheusRule.runbookBaseURL": "https://example.com/rb/"})
    by_name = {rule["alert"]: rule for rule in _rules(spec)}
    assert by_name["GPUStackWebhookLatencyNearTimeout"]["expr"].endswith("> 15")
    assert 'job="wh", namespace="gpu-stack"' in by_name["GPUStackWebhookDown"]["expr"]
    assert 'job="dcgm", namespace="gpu-stack"' in by_name["GPUStackDCGMExporterDown"]["expr"]
    assert 'created_by_name="t-gpu-stack-device-plugin"' in by_name["GPUStackNodeAdvertisesNoGPUs"]["expr"]
    assert by_name["GPUStackGPUTemperatureHigh"]["annotations"]["runbook_url"] == (
        "https://example.com/rb/GPUStackGPUTemperatureHigh.md")


def test_policy_only_alerts_watch_the_gpu_operators_agents() -> None:
    objects = render(3, "policy-only-gpu-operator.yaml", {"monitoring.prometheusRule.enabled": True}).objects()
    by_name = {rule["alert"]: rule for rule in _rules(one(objects, "PrometheusRule", "t-gpu-stack-alerts")["spec"])}
    assert 'job="t-gpu-stack-webhook", namespace="gpu-stack"' in by_name["GPUStackWebhookDown"]["expr"]
    assert 'job="nvidia-dcgm-exporter", namespace="gpu-operator"' in by_name["GPUStackDCGMExporterDown"]["expr"]
    assert ('namespace="gpu-operator", created_by_kind="DaemonSet", created_by_name="nvidia-device-plugin-daemonset"'
            in by_name["GPUStackNodeAdvertisesNoGPUs"]["expr"])


@pytest.mark.parametrize(("enabled", "served", "expected"), [
    ("auto", False, False), ("auto", True, True), (True, False, True), (False, True, False)])
def test_rule_renders_when_served_or_forced(enabled: object, served: bool, expected: bool) -> None:
    args = template_args(set_json={"monitoring.prometheusRule.enabled": enabled}) + (RULE_API if served else [])
    rendered = run_helm(3, args)
    assert rendered.ok, rendered.stderr
    assert bool(find(rendered.objects(), "PrometheusRule")) is expected


def test_rule_carries_the_selector_labels_kube_prometheus_stack_needs() -> None:
    objects = render(3, "default", {"monitoring.prometheusRule.enabled": True,
                                    "monitoring.prometheusRule.labels": {"release": "kps"}}).objects()
    rule = one(objects, "PrometheusRule", "t-gpu-stack-alerts")
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["metadata"]["namespace"] == "gpu-stack"


def test_webhook_service_monitor_scrapes_https_and_verifies_the_certificate() -> None:
    objects = render(3, "default", {"monitoring.webhookServiceMonitor.enabled": True}).objects()
    monitor = one(objects, "ServiceMonitor", "t-gpu-stack-webhook")
    service = one(objects, "Service", "t-gpu-stack-webhook")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["spec"]["selector"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["scheme"], endpoint["path"]) == ("https", "https", "/metrics")
    assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]
    assert endpoint["tlsConfig"] == {"serverName": "t-gpu-stack-webhook.gpu-stack.svc",
                                     "ca": {"secret": {"name": "t-gpu-stack-webhook-tls", "key": "ca.crt"}}}
    custom = render(3, "default", {"monitoring.webhookServiceMonitor.enabled": True,
                                   "monitoring.webhookServiceMonitor.tlsConfig": {"insecureSkipVerify": True}})
    (endpoint,) = one(custom.objects(), "ServiceMonitor", "t-gpu-stack-webhook")["spec"]["endpoints"]
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}


def test_nothing_monitoring_renders_without_the_operator() -> None:
    """The monitoring stack absent: no ServiceMonitor, no PrometheusRule, and the render succeeds."""
    objects = render(3).objects()
    assert find(objects, "PrometheusRule") == [] and find(objects, "ServiceMonitor") == []


def test_no_alert_annotation_reads_a_host_label_its_expression_may_lack() -> None:
    """An annotation that prints `$labels.Hostname` needs an expression that sets it from either spelling
    (promql.with_hostname, around the whole expression or, for GPUStackGPUAllocatedIdle, around the series it
    groups by Hostname); no annotation reads the lowercase `hostname`, which older exporters lack."""
    for alert in alerts.alerts():
        text = alert.summary + alert.description
        assert "$labels.hostname" not in text, alert.name
        if "$labels.Hostname" in text:
            assert ', "Hostname", "$1", "hostname", "(.+)")' in alert.expr, alert.name
            assert alert.expr.startswith("label_replace(") or "by (namespace, pod, Hostname)" in alert.expr, alert.name


def test_the_host_unit_tests_fail_without_the_relabelling(tmp_path: Path) -> None:
    """Without with_hostname, a lowercase `hostname` leaves the annotations' host empty: the unit tests say so."""
    spec = rendered_rules()
    for rule in _rules(spec):
        prefix = "label_replace("
        if rule["expr"].startswith(prefix):
            rule["expr"] = rule["expr"][len(prefix):].rsplit(', "Hostname"', 1)[0]
    write_rules(tmp_path, spec)
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    result = run_promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert result.returncode != 0 and "GPU 1 (GPU-1111) on  reported XID 79" in result.stdout + result.stderr
