"""The fleet module itself (fleet.py): what it publishes for an overlay's device plugin configs, as the
API server then holds it, and the descriptions it refuses."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from gpu_stack_dev.e2e.e2elib import E2ECluster, unique
from gpu_stack_dev.e2e.fleet import (
    AGENT_LABELS,
    FLEET_TAINT_KEY,
    FULL_GPU,
    MIG_LABEL,
    MPS_TAINT,
    ChartSharing,
    Fleet,
    FleetError,
    NodeSpec,
    plan,
)

A100_40, A100_80, H100 = "NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"


def gpu_resources(resources: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in resources.items() if k.startswith("nvidia.com/")}


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


def test_mig_mixed_nodes_get_the_all_balanced_profiles(cluster: E2ECluster) -> None:
    """mig-mixed-all-balanced: the chart's NodeFeatureRule gives A100/H100 nodes the all-balanced layout, the
    MIG manager splits every GPU as the overlay says (A100-40GB 2x 1g.5gb, 1x 2g.10gb, 1x 3g.20gb; 80GB
    parts 2x 1g.10gb, 1x 2g.20gb, 1x 3g.40gb), the plugin advertises each profile as nvidia.com/mig-<p>
    and a GPU without MIG stays nvidia.com/gpu."""
    sharing = ChartSharing.render(cluster.helm, "mig-mixed-all-balanced.yaml")
    nodes = {m: plan(NodeSpec("n", gpus=2, model=m), sharing) for m in (A100_40, A100_80, H100, "Tesla-T4")}
    assert {m: gpu_resources(n.resources) for m, n in nodes.items()} == {
        A100_40: {"nvidia.com/mig-1g.5gb": "4", "nvidia.com/mig-2g.10gb": "2", "nvidia.com/mig-3g.20gb": "2"},
        A100_80: {"nvidia.com/mig-1g.10gb": "4", "nvidia.com/mig-2g.20gb": "2", "nvidia.com/mig-3g.40gb": "2"},
        H100: {"nvidia.com/mig-1g.10gb": "4", "nvidia.com/mig-2g.20gb": "2", "nvidia.com/mig-3g.40gb": "2"},
        "Tesla-T4": {FULL_GPU: "2"},
    }
    a100 = nodes[A100_40].labels
    assert {k: a100[k] for k in ("nvidia.com/mig.strategy", "nvidia.com/mig.config", "nvidia.com/mig.config.state",
                                 "nvidia.com/gpu.product", "nvidia.com/gpu.count",
                                 "nvidia.com/mig-1g.5gb.product", "nvidia.com/mig-1g.5gb.count",
                                 "nvidia.com/mig-3g.20gb.count")} == {
        "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config": "all-balanced",
        "nvidia.com/mig.config.state": "success", "nvidia.com/gpu.product": A100_40, "nvidia.com/gpu.count": "2",
        "nvidia.com/mig-1g.5gb.product": f"{A100_40}-MIG-1g.5gb", "nvidia.com/mig-1g.5gb.count": "4",
        "nvidia.com/mig-3g.20gb.count": "2"}
    # The T4 is not in the NodeFeatureRule: no layout label, but GFD still names the strategy.
    t4 = nodes["Tesla-T4"].labels
    assert ("nvidia.com/mig.config" in t4, t4["nvidia.com/mig.strategy"]) == (False, "mixed")
    assert all(k in AGENT_LABELS or MIG_LABEL.match(k) or k.startswith("kubernetes.io/")
               for n in nodes.values() for k in n.labels)


def test_mig_single_nodes_advertise_slices_as_gpus(cluster: E2ECluster) -> None:
    """mig-single-all-1g: every MIG-capable GPU in 7 slices of its smallest profile, each one nvidia.com/gpu;
    GFD overloads nvidia.com/gpu.product/.count with the MIG devices (upstream GFD docs: A100-SXM4-40GB-MIG-1g.5gb)."""
    sharing = ChartSharing.render(cluster.helm, "mig-single-all-1g.yaml")
    a100 = plan(NodeSpec("n", gpus=8, model=A100_40), sharing)
    h100 = plan(NodeSpec("n", gpus=1, model=H100), sharing)
    assert (gpu_resources(a100.resources), gpu_resources(h100.resources)) == ({FULL_GPU: "56"}, {FULL_GPU: "7"})
    assert {k: a100.labels[k] for k in ("nvidia.com/mig.strategy", "nvidia.com/gpu.product", "nvidia.com/gpu.count",
                                        "nvidia.com/mig.config")} == {
        "nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": f"{A100_40}-MIG-1g.5gb",
        "nvidia.com/gpu.count": "56", "nvidia.com/mig.config": "all-1g"}
    assert h100.labels["nvidia.com/gpu.product"] == f"{H100}-MIG-1g.10gb"
    # The full GPU's memory would be wrong for a slice, and the slice's memory is not modelled: left off.
    assert "nvidia.com/gpu.memory" not in a100.labels


def test_a_mig_fleet_names_only_what_the_agents_publish(cluster: E2ECluster) -> None:
    """Bad MIG descriptions are FleetErrors, as for sharing."""
    single = ChartSharing.render(cluster.helm, "mig-single-all-1g.yaml")
    per_node = ChartSharing.render(cluster.helm, "per-node-configs.yaml")
    with pytest.raises(FleetError, match=r"MIG layout 'all-9g\.1tb' is not in the chart's MIG manager config"):
        plan(NodeSpec("n", gpus=1, model=A100_40, mig_config="all-9g.1tb"), single)
    with pytest.raises(FleetError, match="Tesla-T4 has no MIG"):
        plan(NodeSpec("n", gpus=1, mig_config="all-1g"), single)
    with pytest.raises(FleetError, match=r"no upstream agent publishes the label\(s\) nvidia.com/mig-1g.5gb.count"):
        plan(NodeSpec("n", gpus=1, model=A100_40, labels={"nvidia.com/mig-1g.5gb.count": "7"}), single)
    with pytest.raises(FleetError, match=r"no upstream agent publishes the label\(s\) nvidia.com/mig.fancy"):
        plan(NodeSpec("n", gpus=1, model=A100_40, labels={"nvidia.com/mig.fancy": "yes"}), single)
    with pytest.raises(FleetError, match="migStrategy single with several MIG profiles"):
        plan(NodeSpec("n", gpus=1, model=A100_40, mig_config="all-balanced"), single)
    with pytest.raises(FleetError, match="MIG devices under migStrategy none are not modelled"):
        plan(NodeSpec("n", gpus=1, model=A100_40, config="default", mig_config="all-balanced"), per_node)
    # A MIG resource label is an agent's only where that resource exists.
    mixed = plan(NodeSpec("n", gpus=1, model=A100_40, config="mig-mixed", mig_config="all-balanced",
                          labels={"nvidia.com/mig-1g.5gb.count": "2"}), per_node)
    assert gpu_resources(mixed.resources)["nvidia.com/mig-1g.5gb"] == "2"
    with pytest.raises(FleetError, match="no such MIG resource here"):
        plan(NodeSpec("n", gpus=1, model=A100_40, config="mig-mixed", mig_config="all-balanced",
                      labels={"nvidia.com/mig-1g.10gb.count": "2"}), per_node)
    # per-node-configs leaves migManager.defaultConfig empty: without the user's label MIG stays off.
    off = plan(NodeSpec("n", gpus=1, model=A100_40, config="mig-mixed"), per_node)
    assert gpu_resources(off.resources) == {FULL_GPU: "1"} and "nvidia.com/mig.config" not in off.labels
