"""The fleet module itself (fleet.py): what it publishes for an overlay's device plugin configs, as the
API server then holds it, and the descriptions it refuses."""

from __future__ import annotations

import pytest

from .e2elib import E2ECluster, unique
from .fleet import AGENT_LABELS, FLEET_TAINT_KEY, FULL_GPU, MPS_TAINT, ChartSharing, Fleet, FleetError, NodeSpec, plan


def test_published_nodes_are_what_the_agents_leave(cluster: E2ECluster) -> None:
    t4, mps, cpu = unique("t4"), unique("mps"), unique("cpu")
    sharing = ChartSharing.render(cluster.helm, "per-node-configs.yaml")
    specs = [NodeSpec(t4, gpus=2, config="ts-x4"), NodeSpec(mps, gpus=1, model="NVIDIA-L4", config="mps-x10"),
             NodeSpec(cpu)]
    with Fleet(cluster, sharing, specs):
        nodes = {n["metadata"]["name"]: n for n in cluster.get_json("nodes")["items"]}
        published = {name: nodes[name] for name in (t4, mps, cpu)}
    gpus = {name: {k: v for k, v in n["status"]["allocatable"].items() if k.startswith("nvidia.com/")}
            for name, n in published.items()}
    assert gpus == {t4: {FULL_GPU: "8"}, mps: {FULL_GPU: "10"}, cpu: {}}
    assert {name: [t for t in n["spec"]["taints"] if t["key"] != FLEET_TAINT_KEY]
            for name, n in published.items()} == {t4: [], mps: [MPS_TAINT], cpu: []}
    assert all(n["status"]["capacity"] == n["status"]["allocatable"] for n in published.values())
    assert all({"type": "Ready", "status": "True"}.items() <= c.items()
               for n in published.values() for c in n["status"]["conditions"] if c["type"] == "Ready")
    labels = {name: n["metadata"]["labels"] for name, n in published.items()}
    assert {k: labels[t4][k] for k in ("nvidia.com/device-plugin.config", "nvidia.com/gpu.product",
                                       "nvidia.com/gpu.count", "nvidia.com/gpu.replicas",
                                       "nvidia.com/gpu.sharing-strategy", "nvidia.com/mps.capable")} == {
        "nvidia.com/device-plugin.config": "ts-x4", "nvidia.com/gpu.product": "Tesla-T4-SHARED",
        "nvidia.com/gpu.count": "2", "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing",
        "nvidia.com/mps.capable": "false"}
    assert (labels[mps]["nvidia.com/gpu.sharing-strategy"], labels[mps]["nvidia.com/mps.capable"]) == ("mps", "true")
    assert not any(k.startswith("nvidia.com/") for k in labels[cpu])
    # Deleted on leaving the with.
    assert cluster.kubectl("get", "node", t4, check=False).returncode == 1


def test_a_fleet_names_only_what_the_agents_publish(cluster: E2ECluster) -> None:
    """Bad fleet descriptions fail before anything is created (FleetError), never a silent fake."""
    sharing = ChartSharing.render(cluster.helm, "time-slicing-t4-x4.yaml")
    with pytest.raises(FleetError, match=r"no upstream agent publishes the label\(s\) nvidia.com/gpu.fancy"):
        plan(NodeSpec("n", gpus=1, labels={"nvidia.com/gpu.fancy": "yes"}), sharing)
    with pytest.raises(FleetError, match="GPU model 'RTX-9999' is not one the fleet knows"):
        plan(NodeSpec("n", gpus=1, model="RTX-9999"), sharing)
    with pytest.raises(FleetError, match="device plugin config 'mps-x10' is not in the chart's configs"):
        plan(NodeSpec("n", gpus=1, config="mps-x10"), sharing)
    with pytest.raises(FleetError, match="a node without GPUs gets no device plugin config"):
        plan(NodeSpec("n", config="ts-t4-x4"), sharing)
    mig = ChartSharing.render(cluster.helm, "mig-single-all-1g.yaml")
    with pytest.raises(FleetError, match="migStrategy 'single' is not modelled"):
        plan(NodeSpec("n", gpus=1, model="NVIDIA-A100-SXM4-40GB"), mig)
    # What it does publish: only agent and kubelet labels, the resources of the chart's config.
    node = plan(NodeSpec("n", gpus=2), sharing)
    assert set(node.labels) - {"kubernetes.io/hostname", "kubernetes.io/os", "kubernetes.io/arch"} <= AGENT_LABELS
    assert node.resources[FULL_GPU] == "8"


def test_rename_by_default_publishes_the_shared_name(cluster: E2ECluster) -> None:
    """renameByDefault: the plugin advertises nvidia.com/gpu.shared instead of nvidia.com/gpu, GFD keeps
    the nvidia.com/gpu.* labels and leaves -SHARED off the product (upstream resource.go productLabel)."""
    sharing = ChartSharing.render(cluster.helm, "time-slicing-t4-x4.yaml",
                                  set_json={"sharing.configs.ts-t4-x4.timeSlicing.renameByDefault": True})
    node = plan(NodeSpec("n", gpus=2, config="ts-t4-x4"), sharing)
    assert {k: v for k, v in node.resources.items() if k.startswith("nvidia.com/")} == {"nvidia.com/gpu.shared": "8"}
    assert node.labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert node.labels[sharing.config_label] == "ts-t4-x4"
