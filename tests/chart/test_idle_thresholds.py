"""`kubectl gpu-stack inspect --idle` judges idle by the thresholds the chart's alert GPUStackGPUAllocatedIdle uses
(monitoring.idleGpu): the chart writes them on the device plugin ConfigMap inspect already reads, and inspect's
defaults come from there (flags still win)."""

from __future__ import annotations

import argparse

import pytest
from gpu_stack_dev.chartlib import FULLNAME, one, render
from gpu_stack_webhook.gpuinspect import usage_query

CONFIGMAP = f"{FULLNAME}-device-plugin-configs"


def _inspect_settings(annotations: dict[str, str], *flags: str) -> usage_query.Settings:
    parser = argparse.ArgumentParser()
    usage_query.add_arguments(parser)
    chosen, notes = usage_query.settings(parser.parse_args(["--idle", *flags]), annotations)
    assert notes == []
    return chosen


def _annotations(idle: dict[str, object] | None = None) -> dict[str, str]:
    objects = render(4, set_json={"monitoring": {"idleGpu": idle}} if idle else None).objects()
    return one(objects, "ConfigMap", CONFIGMAP)["metadata"]["annotations"]


def test_inspect_idle_defaults_are_the_alerts_defaults() -> None:
    chosen = _inspect_settings(_annotations())
    assert (chosen.window, chosen.below) == ("30m", 5.0)


@pytest.mark.parametrize(("below", "window", "seconds"), [(10, "2h", 7200), (2.5, "1d", 86400)])
def test_inspect_idle_follows_the_chart_values(below: float, window: str, seconds: int) -> None:
    annotations = _annotations({"utilizationPercentBelow": below, "window": window})
    chosen = _inspect_settings(annotations)
    assert (chosen.window, chosen.seconds, chosen.below) == (window, seconds, below)
    # A flag still wins over the chart.
    assert _inspect_settings(annotations, "--idle-below", "1", "--since", "10m").below == 1.0
