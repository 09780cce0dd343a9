"""The inspect model: GFD labels, the chart's device plugin configs and bound pods -> per-node records."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from gpu_stack_dev.inspect_cluster import FINISHED_PODS, NODES, PENDING_POD, PODS, chart_configmap, container, node, pod
from gpu_stack_webhook.gpuinspect.model import build_report, pod_requests, sharing_from_configmap
from gpu_stack_webhook.gpuinspect.records import MpsLimits, NodeRecord, Report
from gpu_stack_webhook.gpuinspect.render import render
from gpu_stack_webhook.policy.config import ConfigError


def chart_sharing() -> Any:
    cm = chart_configmap()
    return sharing_from_configmap(cm["data"], cm["metadata"]["annotations"]["gpu-stack.io/default-config"])


def records(report: Report) -> dict[str, NodeRecord]:
    return {n.name: n for n in report.nodes}


def usage(record: NodeRecord) -> dict[str, tuple[int, int, int, int]]:
    return {r.name: (r.capacity, r.allocatable, r.requested, r.free) for r in record.resources}


def test_four_node_cluster() -> None:
    report = build_report(NODES, [*PODS, *FINISHED_PODS, PENDING_POD], chart_sharing())
    nodes = records(report)
    assert list(nodes) == ["gpu-a100-exclusive", "gpu-a100-mig", "gpu-l4-mps", "gpu-t4-timesliced"]
    assert report.other_nodes == 1  # cpu-worker

    exclusive = nodes["gpu-a100-exclusive"]
    assert (exclusive.product, exclusive.memory_mib, exclusive.gpu_count) == ("NVIDIA-A100-SXM4-40GB", 40960, 2)
    assert (exclusive.config_label, exclusive.config) == (None, "default")  # no label: the default config
    assert usage(exclusive) == {"nvidia.com/gpu": (2, 2, 1, 1)}  # the Succeeded pod holds nothing
    assert [(r.strategy, r.replicas, r.mps) for r in exclusive.resources] == [("exclusive", 1, None)]

    ts = nodes["gpu-t4-timesliced"]
    assert (ts.product, ts.sharing_strategy, ts.replicas, ts.config) == ("Tesla-T4-SHARED", "time-slicing", 4, "ts-x4")
    assert usage(ts) == {"nvidia.com/gpu": (8, 8, 4, 4)}
    assert [(h.namespace, h.pod, h.container, h.amount) for h in ts.holders] == [
        ("ml", "notebook-1", "jupyter", 1), ("ml", "notebook-2", "jupyter", 1),
        ("vision", "detector", "infer", 1), ("vision", "detector", "tracker", 1)]

    mps = nodes["gpu-l4-mps"]
    assert usage(mps) == {"nvidia.com/gpu": (10, 10, 3, 7)}  # the Failed pod holds nothing
    (res,) = mps.resources
    assert (res.strategy, res.replicas) == ("mps", 10)
    assert res.mps == MpsLimits(memory_mib=2303, active_thread_percentage=10)

    mig = nodes["gpu-a100-mig"]
    assert (mig.mig_strategy, mig.mig_config, mig.mig_state, mig.config) == ("mixed", "all-balanced", "success",
                                                                            "mig-mixed")
    assert usage(mig) == {"nvidia.com/mig-1g.5gb": (2, 2, 1, 1), "nvidia.com/mig-2g.10gb": (1, 1, 0, 1),
                          "nvidia.com/mig-3g.20gb": (1, 1, 1, 0)}
    assert {r.strategy for r in mig.resources} == {"exclusive"}  # mixed: every profile its own resource

    assert [(t.name, t.allocatable, t.requested, t.free) for t in report.totals] == [
        ("nvidia.com/gpu", 20, 8, 12), ("nvidia.com/mig-1g.5gb", 2, 1, 1), ("nvidia.com/mig-2g.10gb", 1, 0, 1),
        ("nvidia.com/mig-3g.20gb", 1, 1, 0)]
    assert (report.gpus, report.holding_pods) == (6, 9)


def test_mps_limits_follow_the_mps_control_daemon() -> None:
    # NVIDIA/k8s-device-plugin v0.20.0 cmd/mps-control-daemon/mps/daemon.go: perDevicePinnedDeviceMemoryLimits
    # sets totalMemory/replicas per device, activeThreadPercentage 100/replicas (integer division).
    labels = {"nvidia.com/gpu.product": "Tesla-T4-SHARED", "nvidia.com/gpu.memory": "15360",
              "nvidia.com/gpu.count": "1", "nvidia.com/gpu.replicas": "3", "nvidia.com/gpu.sharing-strategy": "mps"}
    report = build_report([node("n", labels, {"nvidia.com/gpu": 3})], [])  # no ConfigMap: the labels say it
    (res,) = report.nodes[0].resources
    assert (res.strategy, res.replicas, res.mps) == ("mps", 3, MpsLimits(5120, 33))


def test_without_configmap_strategy_comes_from_gfd_labels() -> None:
    nodes = records(build_report(NODES, PODS))
    assert [(r.strategy, r.replicas) for r in nodes["gpu-t4-timesliced"].resources] == [("time-slicing", 4)]
    assert [(r.strategy, r.replicas) for r in nodes["gpu-a100-exclusive"].resources] == [("exclusive", 1)]
    assert nodes["gpu-a100-exclusive"].config is None


def test_label_naming_no_config_falls_back_to_default() -> None:
    labels = {**NODES[1]["metadata"]["labels"], "nvidia.com/device-plugin.config": "typo"}
    report = build_report([node("n", labels, {"nvidia.com/gpu": 2})], [], chart_sharing())
    assert report.nodes[0].config == "default"
    assert report.nodes[0].notes == (
        "nvidia.com/device-plugin.config=typo names no config; the device plugin falls back to 'default'",)


def test_mig_pending_and_overcommit_are_noted() -> None:
    mig = copy.deepcopy(NODES[3])
    mig["metadata"]["labels"]["nvidia.com/mig.config.state"] = "pending"
    pods = [pod("a", f"p{i}", "gpu-a100-mig", [container("c", {"nvidia.com/mig-2g.10gb": 1})]) for i in range(2)]
    (record,) = build_report([mig], pods).nodes
    assert record.notes == ("MIG reconfiguration to 'all-balanced' is pending",
                            "nvidia.com/mig-2g.10gb: pods request 2, 1 allocatable")


def test_pod_requests_count_like_the_scheduler() -> None:
    gpu = "nvidia.com/gpu"
    spec = {
        "initContainers": [
            {"name": "setup", "resources": {"limits": {gpu: "3"}}},  # runs alone before the sidecar
            {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {gpu: "1"}, "limits": {gpu: "1"}}},
            {"name": "late", "resources": {"limits": {gpu: "2"}}},  # runs beside the sidecar: 3
        ],
        "containers": [{"name": "main", "resources": {"limits": {gpu: "1", "cpu": "2"}}}],
    }
    assert pod_requests(spec, lambda r: r.startswith("nvidia.com/")) == {gpu: 3}
    spec["containers"].append({"name": "second", "resources": {"limits": {gpu: "2"}}})
    assert pod_requests(spec, lambda r: r.startswith("nvidia.com/")) == {gpu: 4}  # 1 sidecar + 1 + 2


def test_pod_overhead_is_added_after_the_init_container_peak() -> None:
    # component-helpers resource/helpers.go PodRequests: max(containers + sidecars, init peak), then
    # spec.overhead on top (the RuntimeClass's), not overhead into the sum before the max.
    gpu = "nvidia.com/gpu"
    spec = {"initContainers": [{"name": "setup", "resources": {"limits": {gpu: "3"}}}],
            "containers": [{"name": "main", "resources": {"limits": {gpu: "1"}}}],
            "overhead": {gpu: "1", "cpu": "250m"}}
    assert pod_requests(spec, lambda r: r.startswith("nvidia.com/")) == {gpu: 4}


def test_a_limit_alone_is_the_request_and_requests_win_when_both_are_set() -> None:
    mig = "nvidia.com/mig-1g.5gb"
    spec = {"containers": [{"name": "a", "resources": {"limits": {mig: "2"}}},
                           {"name": "b", "resources": {"requests": {mig: "1"}, "limits": {mig: "1"}}}]}
    assert pod_requests(spec, lambda r: r.startswith("nvidia.com/")) == {mig: 3}


def test_names_from_the_sharing_configs_are_gpus() -> None:
    # An older device plugin honoured `rename`: the webhook's rules count the renamed resource as a GPU,
    # and so does inspect when it has read the configs.
    config = ("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
              "    - {name: nvidia.com/gpu, rename: nvidia.com/gpu-ts, replicas: 4}\n")
    sharing = sharing_from_configmap({"only": config})
    renamed = "nvidia.com/gpu-ts"
    nodes = [node("n", {"nvidia.com/gpu.present": "true"}, {renamed: 4})]
    pods = [pod("a", "p", "n", [container("c", {renamed: 1})])]
    (with_configs,) = build_report(nodes, pods, sharing).nodes
    assert usage(with_configs) == {renamed: (4, 4, 1, 3)}
    (without,) = build_report(nodes, pods).nodes
    assert usage(without) == {}


def test_namespace_limits_holders_not_counts() -> None:
    report = build_report(NODES, PODS, holder_namespace="vision")
    nodes = records(report)
    assert usage(nodes["gpu-t4-timesliced"]) == {"nvidia.com/gpu": (8, 8, 4, 4)}
    assert {h.namespace for n in report.nodes for h in n.holders} == {"vision"}


def test_pods_on_unlisted_nodes_and_unbound_pods_are_ignored() -> None:
    report = build_report(NODES[:1], [*PODS, PENDING_POD])
    assert [n.name for n in report.nodes] == ["gpu-a100-exclusive"]
    assert report.holding_pods == 1


def test_node_with_gpu_labels_but_nothing_advertised_is_a_gpu_node() -> None:
    labels = {"nvidia.com/gpu.present": "true"}
    (record,) = build_report([node("starting", labels, {})], []).nodes
    assert (record.name, record.resources, record.product) == ("starting", (), None)


@pytest.mark.parametrize("data", [{}, {"bad": "version: v2"}, {"bad": "{not yaml"}])
def test_unusable_configmap_is_a_config_error(data: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        sharing_from_configmap(data)


def test_single_config_is_the_default_without_annotation() -> None:
    index = sharing_from_configmap({"only": "version: v1\nflags: {migStrategy: single}\n"})
    assert index.default == "only"


def _slice(node_name: str, devices: list[str], generation: int = 1, driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    # The shape kubernetes-sigs/dra-driver-nvidia-gpu's gpu-kubelet-plugin publishes (driver.go publishResources:
    # one pool per node, named after it; deviceinfo.go GpuInfo.GetDevice: gpu-<minor>, attributes type, productName).
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "spec": {"driver": driver, "nodeName": node_name,
                     "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
                     "devices": [{"name": d, "attributes": {"type": {"string": "gpu"},
                                                            "productName": {"string": "NVIDIA A100-SXM4-40GB"}}}
                                 for d in devices]}}


def _claim(namespace: str, name: str, node_name: str, device: str, pods: list[str]) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node_name, "device": device}]}},
                "reservedFor": [{"resource": "pods", "name": p, "uid": "u"} for p in pods]}}


def test_dra_devices_allocated_by_claims_and_free() -> None:
    dra_node = node("dra-1", {}, {})  # no device plugin, no GFD labels: a DRA-only GPU node
    slices = [_slice("dra-1", ["gpu-0", "gpu-1"], generation=2), _slice("dra-1", ["gpu-9"], generation=1),
              _slice("dra-1", ["nic-0"], driver="example.com/nic")]
    claims = [_claim("ml", "trainer-gpu-x7", "dra-1", "gpu-1", ["trainer"]), {"metadata": {"name": "pending"}}]
    report = build_report([dra_node, NODES[-1]], [], resource_slices=slices, resource_claims=claims)
    (record,) = report.nodes  # the CPU worker has no slices: still not a GPU node
    assert [(d.name, d.type, d.product, d.claim, d.pods) for d in record.dra] == [
        ("gpu-0", "gpu", "NVIDIA A100-SXM4-40GB", None, ()),
        ("gpu-1", "gpu", "NVIDIA A100-SXM4-40GB", "ml/trainer-gpu-x7", ("ml/trainer",))]  # gen 1 and the NIC: not
    assert report.dra_devices == (2, 1)
    assert report.to_dict()["summary"]["draDevices"] == {"published": 2, "allocated": 1, "free": 1}
    table = render(report, "table")
    assert (
        "  DRA DEVICE   DRIVER           POOL    TYPE   PRODUCT                 CLAIM               PODS\n"
        "  gpu-0        gpu.nvidia.com   dra-1   gpu    NVIDIA A100-SXM4-40GB   free                -\n"
        "  gpu-1        gpu.nvidia.com   dra-1   gpu    NVIDIA A100-SXM4-40GB   ml/trainer-gpu-x7   ml/trainer\n"
    ) in table
    assert table.endswith("1 GPU node, 0 GPUs; DRA devices free: 1/2; 0 pods holding GPU resources\n")


def test_unhealthy_gpus_and_the_pods_still_holding_them() -> None:
    """A device the plugin reports Unhealthy leaves capacity and drops from allocatable (the kubelet's
    device manager); measured on a kubelet v1.36.2 node with the stand-in plugin (tests/e2e/deviceplugin)."""
    ts = copy.deepcopy(NODES[1])  # gpu-t4-timesliced: 8 replicas
    ts["status"]["allocatable"]["nvidia.com/gpu"] = "7"
    pods = [pod("ml", "notebook-1", "gpu-t4-timesliced", [container("c", {"nvidia.com/gpu": 1})]),
            pod("vision", "detector", "gpu-t4-timesliced", [container("c", {"nvidia.com/gpu": 1})])]
    report = build_report([ts], pods, chart_sharing(), holder_namespace="ml")
    (record,) = report.nodes
    assert [(r.capacity, r.allocatable, r.unhealthy) for r in record.resources] == [(8, 7, 1)]
    # Every namespace's holders are named: the unhealthy device may be any of theirs.
    assert record.notes == ("nvidia.com/gpu: 1 of 8 unhealthy; still held by ml/notebook-1, vision/detector "
                            "(the API does not say which pod has which device)",)
    text = render(report, "table")
    assert "note: nvidia.com/gpu: 1 of 8 unhealthy" in text
    assert "unhealthy: nvidia.com/gpu 1" in text.splitlines()[-1]
    (usage_json,) = json.loads(render(report, "json"))["nodes"][0]["resources"]
    assert (usage_json["capacity"], usage_json["allocatable"], usage_json["unhealthy"]) == (8, 7, 1)
    assert report.to_dict()["summary"]["resources"][0]["unhealthy"] == 1


def test_a_resource_with_nothing_allocatable_and_no_holder() -> None:
    ts = copy.deepcopy(NODES[1])
    ts["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    (record,) = build_report([ts], [], chart_sharing()).nodes
    assert record.notes == ("nvidia.com/gpu: 8 of 8 unhealthy (or its device plugin no longer advertises it); "
                            "no pod holds one",)


def test_healthy_nodes_have_no_unhealthy_note() -> None:
    report = build_report(NODES, PODS, chart_sharing())
    assert all("unhealthy" not in note for n in report.nodes for note in n.notes)
    assert "unhealthy" not in render(report, "table")
