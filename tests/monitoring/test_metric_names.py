"""Every metric name the alerts and dashboards read exists in a cited list: the webhook's own /metrics (scraped
live from the webhook app after real reviews), the DCGM fields the pinned dcgm-exporter accepts, kube-state-metrics,
the API server's admission metrics and Prometheus' `up` (tests/fixtures/*/README.md cite each list). The chart's
counters file (monitoring.dcgmCounters) enables every DCGM field they read."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from gpu_stack_dev.chartlib import ROOT, one, render
from gpu_stack_dev.generate.monitoring import alerts, counters, dashboards, promql
from gpu_stack_webhook.kube.live import RuntimeClassReader
from gpu_stack_webhook.policy.config import parse_config
from gpu_stack_webhook.server.app import AppConfig, create_app
from prometheus_client.parser import text_string_to_metric_families

from tests.webhook.kube_fake import FakeKube
from tests.webhook.podlib import GPU, container, make_pod, review

from .promlib import panel_queries, rendered_dashboards, rendered_rules

FIXTURES = ROOT / "tests" / "fixtures" / "dcgm-exporter"
DCGM_FIELDS = set((FIXTURES / "field-names.txt").read_text().split())
LISTS = ROOT / "tests" / "fixtures" / "metric-names"
CITED = {name: set((LISTS / f"{name}.txt").read_text().split())
         for name in ("kube-state-metrics", "kube-apiserver-admission", "prometheus")}
CONFIGMAP = "t-gpu-stack-dcgm-exporter-metrics"


def enabled_fields(csv: str) -> list[str]:
    """Field of each line the exporter reads (a `#` line is a comment)."""
    lines = [line.strip() for line in csv.splitlines()]
    return [line.split(",")[0].strip() for line in lines if line and not line.startswith("#")]


def metrics_csv(set_json: dict[str, Any] | None = None) -> str:
    objects = render(3, "default", set_json).objects()
    return str(one(objects, "ConfigMap", CONFIGMAP)["data"]["metrics.csv"])


def alert_fields() -> set[str]:
    return counters.fields_in(yaml.safe_dump(alerts.rule_groups()))


def dashboard_fields() -> set[str]:
    return {f for d in dashboards.DASHBOARDS for q in d.queries() for f in counters.fields_in(q.expr)}


def webhook_metrics() -> set[str]:
    """Series names on the webhook's /metrics after a /validate denial and a /mutate review."""
    client = create_app(AppConfig(policy=parse_config({}))).test_client()
    denied = make_pod([container("cuda", gpu=1, privileged=True)], name="privileged")
    for path, pod in (("/validate", denied), ("/mutate", make_pod([container("cuda", requests={GPU: "1"})]))):
        reply = client.post(path, data=json.dumps(review(pod)), content_type="application/json")
        assert reply.status_code == 200
    scrape = client.get("/metrics")
    assert scrape.status_code == 200
    names = {s.name for family in text_string_to_metric_families(scrape.get_data(as_text=True)) for s in family.samples}
    # Following the cluster (serve --runtime-classes live): when each policy source was last read.
    live = create_app(AppConfig(policy=parse_config({}), live=RuntimeClassReader(FakeKube()))).test_client()
    assert live.post("/validate", data=json.dumps(review(denied)), content_type="application/json").status_code == 200
    scrape = live.get("/metrics")
    samples = [s for family in text_string_to_metric_families(scrape.get_data(as_text=True)) for s in family.samples]
    assert any(s.name == "gpu_stack_policy_source_last_read_timestamp_seconds" and s.value > 0 for s in samples)
    return names | {s.name for s in samples}


def read_names() -> dict[str, set[str]]:
    """metric name -> where it is read (rendered alerts and dashboards)."""
    out: dict[str, set[str]] = {}
    for rule in (r for g in rendered_rules()["groups"] for r in g["rules"]):
        for name in promql.metric_names(rule["expr"]):
            out.setdefault(name, set()).add(f"alert {rule['alert']}")
    for uid, board in rendered_dashboards().items():
        for title, expr in panel_queries(board):
            for name in promql.metric_names(expr):
                out.setdefault(name, set()).add(f"{uid}: {title}")
    return out


def source_of(name: str, webhook: set[str]) -> str | None:
    if name in webhook:
        return "webhook /metrics"
    if name in DCGM_FIELDS:
        return "dcgm-exporter"
    for source, names in CITED.items():
        if name in names or promql.family(name) in names:
            return source
    return None


def test_every_metric_name_read_exists_in_a_cited_list() -> None:
    webhook = webhook_metrics()
    read = read_names()
    assert len(read) >= 15
    missing = {name: sorted(where) for name, where in read.items() if source_of(name, webhook) is None}
    assert missing == {}
    sources = {source_of(name, webhook) for name in read}
    assert sources == {"webhook /metrics", "dcgm-exporter", "kube-state-metrics", "kube-apiserver-admission",
                       "prometheus"}


def test_the_live_scrape_has_the_webhook_metrics_the_dashboards_read() -> None:
    assert {"gpu_stack_admission_reviews_total", "gpu_stack_rule_findings_total",
            "gpu_stack_admission_duration_seconds_bucket"} <= webhook_metrics()


def test_a_misspelt_name_is_found_missing() -> None:
    assert source_of("gpu_stack_admission_review_total", webhook_metrics()) is None
    assert source_of("kube_node_status_allocatable_gpus", set()) is None
    assert source_of("apiserver_admission_webhook_admission_duration_seconds_bucket", set()) == (
        "kube-apiserver-admission")


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (a) (rate(foo_total{x="y{"}[5m])) / on (n) group_left () bar offset 5m unless baz',
     {"foo_total", "bar", "baz"}),
    ('label_replace(DCGM_FI_DEV_GPU_UTIL{pod!=""}, "pod", "$1", "exported_pod", "(.+)")', {"DCGM_FI_DEV_GPU_UTIL"}),
    ("histogram_quantile(0.99, sum by (le) (rate(h_bucket[5m]))) > 5", {"h_bucket"}),
    ("count(up == 0) or vector(0)", {"up"}),
])
def test_name_extraction(expr: str, names: set[str]) -> None:
    assert promql.metric_names(expr) == names


def test_the_field_list_fixture_is_the_real_one() -> None:
    assert len(DCGM_FIELDS) > 600
    assert {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"} <= DCGM_FIELDS
    assert "DCGM_FI_DEV_NOT_A_FIELD" not in DCGM_FIELDS


def test_every_counters_file_field_is_one_the_exporter_accepts() -> None:
    assert set(counters.FIELDS) - DCGM_FIELDS == set()


def test_every_field_the_chart_enables_by_default_is_one_the_exporter_accepts() -> None:
    assert set(enabled_fields(metrics_csv())) - DCGM_FIELDS == set()


def test_counters_file_holds_exactly_the_fields_the_alerts_and_dashboards_read() -> None:
    assert alert_fields() | dashboard_fields() == set(counters.FIELDS)


def test_the_default_metrics_enable_every_field_once() -> None:
    fields = enabled_fields(metrics_csv())
    assert set(counters.FIELDS) <= set(fields)
    assert len(fields) == len(set(fields))
    # The chart's own list lacks the row-remap failure the alerts read: the counters file adds it.
    assert "DCGM_FI_DEV_ROW_REMAP_FAILURE" in fields


def test_own_metrics_get_only_the_missing_fields() -> None:
    own = ("DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n"
           "# DCGM_FI_DEV_XID_ERRORS, gauge, commented out: not enabled\n")
    fields = enabled_fields(metrics_csv({"dcgmExporter.metrics": own}))
    assert fields[0] == "DCGM_FI_DEV_GPU_UTIL"
    assert sorted(fields) == sorted(counters.FIELDS)


def test_counters_off_leaves_the_metrics_alone() -> None:
    own = "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n"
    assert metrics_csv({"dcgmExporter.metrics": own, "monitoring.dcgmCounters": False}) == own
