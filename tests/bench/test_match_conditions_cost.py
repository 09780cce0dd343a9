"""bench/match_conditions_cost.py's own parts (no timing here): what it measures and how it reports it."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_stack_dev.bench import match_conditions_cost as cost
from gpu_stack_dev.chartlib import helm_path
from gpu_stack_dev.e2e import apiload
from gpu_stack_webhook.cel import match_conditions, runtime
from gpu_stack_webhook.cel.library import config_values
from gpu_stack_webhook.policy.config import PolicyConfig


def test_it_measures_the_conditions_the_chart_renders_at_a_revision(tmp_path: Path) -> None:
    """The chart as HEAD has it, rendered with default values, gives both webhooks' conditions."""
    found = cost.chart_conditions(helm_path(4), cost.chart_at("HEAD", tmp_path), "HEAD")
    assert set(found) == {"HEAD mutate", "HEAD validate"}
    assert all(e.startswith("[(object.kind == 'Pod'") for e in found.values())
    assert found["HEAD validate"] != found["HEAD mutate"]


def test_the_order_rotates_so_each_configuration_is_evaluated_early_and_late() -> None:
    labels = ["a", "b", "c"]
    assert [cost.rotated(labels, r)[0] for r in range(3)] == ["a", "b", "c"]
    assert cost.rotated(labels, 1) == ["b", "c", "a"]


def test_a_configuration_the_api_server_did_not_evaluate_is_not_reported_as_free() -> None:
    before = {"x": (1.0, 10.0), "y": (2.0, 5.0)}
    after = {"x": (1.0005, 15.0), "y": (2.0, 5.0)}
    assert cost.per_evaluation(before, after) == {"x": pytest.approx(100.0)}


def test_the_table_gives_each_condition_over_the_floor() -> None:
    lines = cost.table({cost.FLOOR: [100.0, 110.0, 90.0], "this checkout validate": [150.0, 160.0, 170.0]})
    assert lines[2] == "| floor (false) | 100, 110, 90 | 100 |  |"
    assert lines[3] == "| this checkout validate | 150, 160, 170 | 160 | +60 |"


def test_the_pod_measured_is_one_the_conditions_do_not_send() -> None:
    """Nothing is called: every configuration points nowhere, and the pod has no signal."""
    values = config_values(PolicyConfig())
    for mutating in (True, False):
        expression = match_conditions.expression(mutating, values)
        assert runtime.evaluate(expression, apiload.pod_body(gpu=False), {}) is False
