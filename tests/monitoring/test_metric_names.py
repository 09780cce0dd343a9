"""Every metric name the alerts and dashboards read exists in a cited list. DCGM fields: the names the
pinned dcgm-exporter accepts (tests/fixtures/dcgm-exporter/README.md says where they come from), and the chart's
counters file (monitoring.dcgmCounters) enables each field they read."""

from __future__ import annotations

from typing import Any

import yaml

from hack.monitoring import alerts, counters
from tests.chart.chartlib import ROOT, one, render

FIXTURES = ROOT / "tests" / "fixtures" / "dcgm-exporter"
DCGM_FIELDS = set((FIXTURES / "field-names.txt").read_text().split())
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


def test_the_field_list_fixture_is_the_real_one() -> None:
    assert len(DCGM_FIELDS) > 600
    assert {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"} <= DCGM_FIELDS
    assert "DCGM_FI_DEV_NOT_A_FIELD" not in DCGM_FIELDS


def test_every_counters_file_field_is_one_the_exporter_accepts() -> None:
    assert set(counters.FIELDS) - DCGM_FIELDS == set()


def test_every_field_the_chart_enables_by_default_is_one_the_exporter_accepts() -> None:
    assert set(enabled_fields(metrics_csv())) - DCGM_FIELDS == set()


def test_counters_file_holds_every_field_the_alerts_read() -> None:
    assert alert_fields() - set(counters.FIELDS) == set()


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
