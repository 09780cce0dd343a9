"""The bookkeeping of bench/scheduler_scale.py (issue 27 item 6): the fleet and the pods it creates, how
a pod list is read as the scheduler left it, the on / off ratio and the section. No cluster, no timing."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import scheduler_scale as ss

LABEL = "nvidia.com/device-plugin.config"


def test_the_pods_are_written_as_the_readme_shows_in_a_fixed_mix() -> None:
    pods = [ss.pod_at(i, LABEL) for i in range(1000)]
    assert Counter(ss.pod_kind(i) for i in range(1000)) == {"plain": 600, "mps": 300, "pinned": 100}
    assert len({p["metadata"]["name"] for p in pods}) == 1000
    for i, pod in enumerate(pods):
        assert pod["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}
        assert (pod["metadata"].get("annotations") == {"gpu-stack.io/mps": "true"}) == (ss.pod_kind(i) == "mps")
        assert (pod["spec"].get("nodeSelector") == {LABEL: "ts-x4"}) == (ss.pod_kind(i) == "pinned")


def test_the_fleet_cycles_the_overlays_configs() -> None:
    specs = ss.fleet_specs(500)
    assert Counter(s.config for s in specs) == {"default": 200, "ts-x4": 150, "mps-x10": 150}
    assert len({s.name for s in specs}) == 500


def _pod(node: str = "", unschedulable: str = "") -> dict[str, object]:
    conditions = [{"type": "PodScheduled", "status": "False", "message": unschedulable}] if unschedulable else []
    return {"spec": {"nodeName": node} if node else {}, "status": {"conditions": conditions}}


def test_a_pod_is_decided_when_bound_or_unschedulable() -> None:
    pods = [_pod("gpu-0001"), _pod(unschedulable="0/3 nodes are available: 3 Insufficient nvidia.com/gpu."),
            _pod(unschedulable="0/3 nodes are available: 3 Insufficient nvidia.com/gpu."), _pod()]
    assert ss.decided(pods) == (1, 2, {"0/3 nodes are available: 3 Insufficient nvidia.com/gpu.": 2})


def test_the_section_puts_on_and_off_side_by_side_with_their_ratio_and_reasons() -> None:
    runs = [ss.ScaleRun(1, ss.OFF, 10, created=10, create_seconds=1.0, decided_seconds=4.0, bound=7, unschedulable=3,
                        reasons={"taint": 3}),
            ss.ScaleRun(1, ss.ON, 10, created=10, create_seconds=2.0, decided_seconds=5.0, bound=9, unschedulable=1,
                        reasons={"Insufficient": 1}),
            ss.ScaleRun(2, ss.ON, 10, created=10, decided_seconds=6.0),
            ss.ScaleRun(2, ss.OFF, 10, created=10, decided_seconds=4.0)]
    assert ss.ratios(runs) == pytest.approx([1.25, 1.5])
    text = ss.render(runs, nodes=3, stamp="Run: x.", command="make bench", concurrency=5,
                     gpus={"nvidia.com/gpu": 12})
    assert text.startswith(ss.BEGIN) and text.rstrip().endswith(ss.END)
    assert f"| 1 | {ss.OFF} | 10 | 1.0 | 4.0 | 7 | 3 | 0 |" in text
    assert f"| 1 | {ss.ON} | 10 | 2.0 | 5.0 | 9 | 1 | 0 |" in text
    assert "per round: 1.25x, 1.50x (median 1.38x)." in text
    assert "12 nvidia.com/gpu advertised" in text and "* 3 x `taint`" in text
