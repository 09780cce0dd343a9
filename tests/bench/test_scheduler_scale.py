"""The bookkeeping of bench/scheduler_scale.py: the fleet and the pods it creates, how
a pod list is read as the scheduler left it, the on / off ratio and the section. No cluster, no timing."""

from __future__ import annotations

import pytest
import yaml
from gpu_stack_dev.bench import scheduler_scale as ss
from gpu_stack_dev.paths import ROOT

LABEL = "nvidia.com/device-plugin.config"


def test_the_pods_are_written_as_the_docs_show() -> None:
    pods = [ss.pod_at(i, LABEL) for i in range(1000)]
    assert len({p["metadata"]["name"] for p in pods}) == 1000
    for i, pod in enumerate(pods):
        assert pod["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}
        assert (pod["metadata"].get("annotations") == {"gpu-stack.io/mps": "true"}) == (ss.pod_kind(i) == "mps")
        assert (pod["spec"].get("nodeSelector") == {LABEL: "ts-x4"}) == (ss.pod_kind(i) == "pinned")


def test_every_pod_has_nodes_of_the_overlay_it_can_land_on() -> None:
    """The fleet runs configs of the per-node-configs overlay, and each kind of pod finds nodes for it there:
    pinned pods their config's, MPS pods an MPS config's, plain pods an exclusive one's."""
    overlay = yaml.safe_load((ROOT / "Chart-values-examples" / "per-node-configs.yaml").read_text())
    configs = overlay["sharing"]["configs"]
    fleet = {s.config for s in ss.fleet_specs(500)}
    assert fleet <= set(configs)
    kinds = {ss.pod_kind(i) for i in range(1000)}
    assert kinds == {"plain", "mps", "pinned"}
    assert "ts-x4" in fleet
    assert any("mps" in configs[c] for c in fleet)
    assert any(not {"mps", "timeSlicing"} & set(configs[c]) for c in fleet)


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
