"""The DCGM fields the chart's alerts and dashboards read, as dcgm-exporter counters CSV lines
(charts/gpu-stack/files/monitoring/dcgm-counters.csv). The DCGM exporter's ConfigMap appends each line whose
field `dcgmExporter.metrics` does not already enable (monitoring.dcgmCounters), so the alerts and panels have
their data whatever the metrics list.

Every name must be a field the pinned dcgm-exporter accepts: tests/monitoring/test_metric_names.py checks
them against tests/fixtures/dcgm-exporter/field-names.txt (its source is in that folder's README.md).
"""

from __future__ import annotations

import re

# field -> (Prometheus type, help), the exporter's CSV columns; help texts as in dcgm-exporter's
# etc/default-counters.csv where the field is there.
FIELDS: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed"),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
}

FIELD_NAME = re.compile(r"\bDCGM_FI_[A-Z0-9_]+\b")


def fields_in(text: str) -> set[str]:
    """The DCGM field names (= dcgm-exporter metric names) an expression or a file mentions."""
    return set(FIELD_NAME.findall(text))


def csv_text() -> str:
    width = max(len(name) for name in FIELDS) + 1
    lines = [f"{name + ',':<{width}} {kind + ',':<8} {help_}" for name, (kind, help_) in FIELDS.items()]
    return "\n".join(lines) + "\n"
