"""Where pods land: the chart installed, its webhook live (on loopback), a simulated fleet (fleet.py)
published as the chart's agents would for the overlay, and the real kube-scheduler binding the pods users
write as README.md tells them. Nothing here asserts on timing: pods are polled until the scheduler has
decided (their PodScheduled condition), with a timeout."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from gpu_stack_dev.e2e.e2elib import E2ECluster, LiveWebhook, Releases, unique
from gpu_stack_dev.e2e.fleet import (
    FULL_GPU,
    MPS_TAINT,
    ChartSharing,
    Fleet,
    NodeSpec,
    delete_pods,
    wait_scheduled,
)

CUDA_IMAGE = "nvcr.io/nvidia/cuda:12.9.1-base-ubuntu24.04"


def gpu_pod(fleet: Fleet, name: str, gpus: int = 1, annotations: dict[str, str] | None = None, *,
            resource: str = FULL_GPU, node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    """A GPU pod as README.md shows: a limit on nvidia.com/gpu (or a MIG profile's resource), nothing else
    about GPUs but what the user chose (the MPS annotation, a nodeSelector pinning a config); plus the
    toleration of this test's fleet (isolation from other tests' pods, see fleet.Fleet)."""
    meta: dict[str, Any] = {"name": name, **({"annotations": annotations} if annotations else {})}
    spec: dict[str, Any] = {"restartPolicy": "Never", "tolerations": [fleet.toleration],
                            "containers": [{"name": "cuda", "image": CUDA_IMAGE, "command": ["nvidia-smi"],
                                            "resources": {"limits": {resource: gpus}}}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


@contextmanager
def placement(cluster: E2ECluster, releases: Releases, live_webhook: Callable[..., LiveWebhook], overlay: str,
              specs: Sequence[NodeSpec]) -> Iterator[tuple[str, Fleet]]:
    """The overlay installed with its webhook live, the fleet published; yields (pod namespace, fleet)."""
    release, _ = releases.install(overlay)
    namespace = cluster.create_namespace()
    live_webhook(release, probe_namespace=namespace)
    with Fleet(cluster, ChartSharing.render(cluster.helm, overlay), specs) as fleet:
        try:
            yield namespace, fleet
        finally:  # before the nodes go: the next test's fleet must not inherit them
            delete_pods(cluster, namespace)
            cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def create(cluster: E2ECluster, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    """Creates the pod through kubectl (webhook and all) and returns it as admitted."""
    return json.loads(cluster.kubectl("create", "-n", namespace, "-o", "json", "-f", "-",
                                      input=json.dumps(pod)).stdout)


def assert_runtime_class_fits(cluster: E2ECluster, fleet: Fleet, admitted: Sequence[dict[str, Any]]) -> None:
    """GPU008: every admitted GPU pod names the NVIDIA runtime class, which the chart created; a RuntimeClass
    with scheduling.nodeSelector adds it to the pod's, so it must select every GPU node of the fleet (or
    GPU pods could never bind there)."""
    assert {p["spec"].get("runtimeClassName") for p in admitted} == {"nvidia"}
    runtime_class = cluster.get_json("runtimeclass", "nvidia")
    assert runtime_class["handler"] == "nvidia"
    selector = (runtime_class.get("scheduling") or {}).get("nodeSelector") or {}
    gpu_nodes = [n for n in fleet if "nvidia.com/gpu.present" in n.labels]
    assert gpu_nodes and all(selector.items() <= n.labels.items() for n in gpu_nodes), selector


def unschedulable(cluster: E2ECluster, namespace: str, pods: Sequence[str]) -> dict[str, str]:
    """pod -> PodScheduled message, for pods the scheduler found unschedulable (all of `pods`, else the
    caller's assert shows which are not)."""
    out = {}
    for pod in pods:
        status, message, node = wait_scheduled(cluster, namespace, pod, want="False")
        out[pod] = message if (status, node) == ("False", "") else f"{status} on {node!r}: {message}"
    return out


def wait_bound(cluster: E2ECluster, namespace: str, count: int, timeout: float = 60) -> dict[str, str]:
    """pod -> node of the namespace's bound pods once at least `count` are bound (or after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        pods = cluster.get_json("pods", "-n", namespace)["items"]
        bound = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")}
        if len(bound) >= count or time.monotonic() > deadline:
            return bound
        time.sleep(0.5)


def test_a_time_sliced_t4_takes_four_pods_and_the_fifth_waits(
        cluster: E2ECluster, releases: Releases, live_webhook) -> None:
    t4, cpu = unique("t4"), unique("cpu")
    overlay = "time-slicing-t4-x4.yaml"
    with placement(cluster, releases, live_webhook, overlay, [NodeSpec(t4, gpus=1), NodeSpec(cpu)]) as (ns, fleet):
        t4_node = next(n for n in fleet if n.name == t4)
        # What the device plugin and GFD publish for the chart's ts-t4-x4 config: 1 GPU x 4 replicas.
        assert t4_node.resources[FULL_GPU] == "4"
        assert {k: t4_node.labels[k] for k in ("nvidia.com/gpu.replicas", "nvidia.com/gpu.sharing-strategy",
                                               "nvidia.com/gpu.product")} == {
            "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing",
            "nvidia.com/gpu.product": "Tesla-T4-SHARED"}
        names = [f"cuda-{i}" for i in range(5)]
        admitted = [create(cluster, ns, gpu_pod(fleet, name)) for name in names]
        # GPU008: the webhook gives every GPU pod the NVIDIA runtime class, which the chart created.
        assert {p["spec"].get("runtimeClassName") for p in admitted} == {"nvidia"}
        assert cluster.get_json("runtimeclass", "nvidia")["handler"] == "nvidia"
        # Four are bound (any four: the pods are alike), all to the T4; the fifth is refused for want of GPUs.
        bound = wait_bound(cluster, ns, count=4)
        assert sorted(bound.values()) == [t4] * 4, bound
        (fifth,) = set(names) - set(bound)
        status, message, node = wait_scheduled(cluster, ns, fifth, want="False")
        assert (status, node) == ("False", ""), (status, message, node)
        assert "Insufficient nvidia.com/gpu" in message, message
        assert len(wait_bound(cluster, ns, count=4)) == 4  # still four


def test_an_mps_pod_lands_on_the_mps_node_with_host_ipc(
        cluster: E2ECluster, releases: Releases, live_webhook) -> None:
    """per-node-configs: MPS nodes beside exclusive ones; only the annotated pod is an MPS pod."""
    mps, plain, cpu = unique("mps"), unique("plain"), unique("cpu")
    specs = [NodeSpec(mps, gpus=1, model="NVIDIA-L4", config="mps-x10"),
             NodeSpec(plain, gpus=1, model="NVIDIA-L4"),  # unlabelled: the overlay's default config, exclusive
             NodeSpec(cpu)]
    with placement(cluster, releases, live_webhook, "per-node-configs.yaml", specs) as (ns, fleet):
        published = {n.name: n for n in fleet}
        # (published taints: the fleet adds its isolation taint on top when it creates the Node)
        assert published[mps].resources[FULL_GPU] == "10" and published[mps].taints == (MPS_TAINT,)
        assert published[mps].labels["nvidia.com/mps.capable"] == "true"
        assert (published[plain].resources[FULL_GPU], published[plain].taints) == ("1", ())
        assert published[plain].labels["nvidia.com/mps.capable"] == "false"

        pod = create(cluster, ns, gpu_pod(fleet, "mps-opt-in", annotations={"gpu-stack.io/mps": "true"}))
        spec = pod["spec"]
        assert spec.get("hostIPC") is True
        assert {"key": "gpu-stack.io/mps", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        assert spec["nodeSelector"] == {"nvidia.com/mps.capable": "true"}
        assert spec["runtimeClassName"] == "nvidia"
        assert wait_scheduled(cluster, ns, "mps-opt-in") == ("True", "", mps)

        # A plain GPU pod is kept off the tainted MPS node: it lands on the exclusive one.
        exclusive = create(cluster, ns, gpu_pod(fleet, "exclusive"))
        assert wait_scheduled(cluster, ns, "exclusive") == ("True", "", plain), exclusive


def test_on_an_all_mps_cluster_a_plain_gpu_pod_is_scheduled(
        cluster: E2ECluster, releases: Releases, live_webhook) -> None:
    """mps-x10: every config is MPS, every GPU node tainted. A plain `nvidia.com/gpu: 1` pod is an MPS pod
    to the webhook (nvidia.com/gpu is MPS-shared wherever it lands): toleration and hostIPC, and it binds;
    it is never left Pending on the taint. An annotated pod gets the mps.capable node selector too, so it
    waits for GFD's label (a GPU node GFD has not labelled yet) and binds once the label is there."""
    first, second, cpu = unique("mps"), unique("mps"), unique("cpu")
    specs = [NodeSpec(first, gpus=1, model="NVIDIA-L4"), NodeSpec(second, gpus=1, model="NVIDIA-L4"), NodeSpec(cpu)]
    with placement(cluster, releases, live_webhook, "mps-x10.yaml", specs) as (ns, fleet):
        assert all(n.taints == (MPS_TAINT,) for n in fleet if n.name != cpu)
        plain = create(cluster, ns, gpu_pod(fleet, "plain"))
        assert plain["spec"].get("hostIPC") is True
        assert {"key": "gpu-stack.io/mps", "operator": "Exists", "effect": "NoSchedule"} in plain["spec"]["tolerations"]
        assert "nodeSelector" not in plain["spec"]
        status, message, node = wait_scheduled(cluster, ns, "plain")
        assert (status, node in (first, second)) == ("True", True), (status, message, node)

        # GFD has not labelled the nodes yet (no nvidia.com/mps.capable): the annotated pod waits ...
        for name in (first, second):
            cluster.kubectl("label", "node", name, "nvidia.com/mps.capable-")
        annotated = create(cluster, ns, gpu_pod(fleet, "annotated", annotations={"gpu-stack.io/mps": "true"}))
        assert annotated["spec"]["nodeSelector"] == {"nvidia.com/mps.capable": "true"}
        waiting = unschedulable(cluster, ns, ["annotated"])["annotated"]
        assert "didn't match Pod's node affinity/selector" in waiting, waiting
        # ... and binds where GFD labels the node.
        cluster.kubectl("label", "node", second, "nvidia.com/mps.capable=true")
        assert wait_scheduled(cluster, ns, "annotated") == ("True", "", second)
        assert_runtime_class_fits(cluster, fleet, [plain, annotated])


# What the overlay comment of mig-mixed-all-balanced.yaml promises per GPU (the all-balanced layout).
BALANCED = {
    "NVIDIA-A100-SXM4-40GB": {"nvidia.com/mig-1g.5gb": 2, "nvidia.com/mig-2g.10gb": 1, "nvidia.com/mig-3g.20gb": 1},
    "NVIDIA-H100-80GB-HBM3": {"nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-2g.20gb": 1, "nvidia.com/mig-3g.40gb": 1},
}


def test_mig_mixed_each_profile_takes_what_the_layout_promises(
        cluster: E2ECluster, releases: Releases, live_webhook) -> None:
    """mig-mixed-all-balanced: per GPU model, each profile takes exactly its count of one-slice pods (as
    README writes them: a limit on nvidia.com/mig-<profile>) on that model's node, one more waits with
    `Insufficient nvidia.com/mig-<profile>`; a GPU without MIG (T4) still takes a whole-GPU pod."""
    names = {model: unique(model.split("-")[1].lower()) for model in BALANCED}
    t4, cpu = unique("t4"), unique("cpu")
    specs = [*(NodeSpec(name, gpus=1, model=model) for model, name in names.items()),
             NodeSpec(t4, gpus=1), NodeSpec(cpu)]
    with placement(cluster, releases, live_webhook, "mig-mixed-all-balanced.yaml", specs) as (ns, fleet):
        published = {n.name: n for n in fleet}
        for model, name in names.items():
            assert {k: int(v) for k, v in published[name].resources.items() if k.startswith("nvidia.com/")} \
                == BALANCED[model]
        admitted, expected, extra = [], {}, {}
        for model, name in names.items():
            for resource, count in BALANCED[model].items():
                profile = resource.removeprefix("nvidia.com/mig-").replace(".", "-")
                for i in range(count + 1):
                    pod = f"{profile}-{i}"
                    admitted.append(create(cluster, ns, gpu_pod(fleet, pod, resource=resource)))
                    if i < count:
                        expected[pod] = name
                    else:
                        extra[pod] = resource
        admitted.append(create(cluster, ns, gpu_pod(fleet, "whole-gpu")))
        expected["whole-gpu"] = t4
        assert wait_bound(cluster, ns, count=len(expected)) == expected
        messages = unschedulable(cluster, ns, list(extra))
        assert {pod: f"Insufficient {resource}" in messages[pod] for pod, resource in extra.items()} == \
            dict.fromkeys(extra, True), messages
        assert_runtime_class_fits(cluster, fleet, admitted)


def test_mig_single_every_slice_is_one_gpu(cluster: E2ECluster, releases: Releases, live_webhook) -> None:
    """mig-single-all-1g: an A100-40GB and an H100 each in 7 slices; 14 one-GPU pods bind (7 per node), the
    15th waits with `Insufficient nvidia.com/gpu`; a pod selecting the slice's product label lands there."""
    a100, h100 = unique("a100"), unique("h100")
    specs = [NodeSpec(a100, gpus=1, model="NVIDIA-A100-SXM4-40GB"),
             NodeSpec(h100, gpus=1, model="NVIDIA-H100-80GB-HBM3")]
    with placement(cluster, releases, live_webhook, "mig-single-all-1g.yaml", specs) as (ns, fleet):
        assert {n.name: n.resources[FULL_GPU] for n in fleet} == {a100: "7", h100: "7"}
        product = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"}
        admitted = [create(cluster, ns, gpu_pod(fleet, "a100-slice", node_selector=product))]
        assert wait_scheduled(cluster, ns, "a100-slice") == ("True", "", a100)
        admitted += [create(cluster, ns, gpu_pod(fleet, f"slice-{i}")) for i in range(14)]
        bound = wait_bound(cluster, ns, count=14)
        assert sorted(bound.values()) == sorted([a100] * 7 + [h100] * 7), bound
        (waiting,) = {f"slice-{i}" for i in range(14)} - set(bound)
        message = unschedulable(cluster, ns, [waiting])[waiting]
        assert "Insufficient nvidia.com/gpu" in message, message
        assert_runtime_class_fits(cluster, fleet, admitted)


def test_per_node_configs_a_pinned_pod_lands_only_on_its_configs_nodes(
        cluster: E2ECluster, releases: Releases, live_webhook) -> None:
    """per-node-configs: a pod pinned to a config as README says (nodeSelector on
    nvidia.com/device-plugin.config) lands only on nodes labelled with it. A node without the label runs
    the default config (README: "nodes without the label use default") but is not selected by a pin on
    `default`: the pinned pod waits for a labelled node (the documented verdict for an unlabelled GPU node)."""
    nodes = {"default": unique("default"), "ts-x4": unique("ts"), "mps-x10": unique("mps"),
             "mig-mixed": unique("mig")}
    unlabelled = unique("unlabelled")
    specs = [NodeSpec(nodes["default"], gpus=1, config="default"),
             NodeSpec(nodes["ts-x4"], gpus=1, config="ts-x4"),
             NodeSpec(nodes["mps-x10"], gpus=1, model="NVIDIA-L4", config="mps-x10"),
             NodeSpec(nodes["mig-mixed"], gpus=1, model="NVIDIA-A100-SXM4-40GB", config="mig-mixed",
                      mig_config="all-balanced"),
             NodeSpec(unlabelled, gpus=2)]
    label = "nvidia.com/device-plugin.config"
    with placement(cluster, releases, live_webhook, "per-node-configs.yaml", specs) as (ns, fleet):
        expected: dict[str, str] = {}
        admitted = []
        for config, node in nodes.items():
            resource = "nvidia.com/mig-1g.5gb" if config == "mig-mixed" else FULL_GPU
            count = {"ts-x4": 4, "mig-mixed": 2}.get(config, 1)
            for i in range(count):
                pod = f"{config}-{i}"
                admitted.append(create(cluster, ns, gpu_pod(fleet, pod, resource=resource,
                                                             node_selector={label: config})))
                expected[pod] = node
        assert wait_bound(cluster, ns, count=len(expected)) == expected
        # The MPS pin made an MPS pod (toleration, hostIPC); the others are left alone.
        by_name = {p["metadata"]["name"]: p["spec"] for p in admitted}
        assert by_name["mps-x10-0"].get("hostIPC") is True and by_name["ts-x4-0"].get("hostIPC") is None
        # The default node is full: another pod pinned to `default` waits, though the unlabelled node
        # (default config, two free GPUs) would fit; an unpinned pod takes the unlabelled node.
        admitted.append(create(cluster, ns, gpu_pod(fleet, "default-pinned", node_selector={label: "default"})))
        admitted.append(create(cluster, ns, gpu_pod(fleet, "unpinned")))
        assert wait_scheduled(cluster, ns, "unpinned") == ("True", "", unlabelled)
        message = unschedulable(cluster, ns, ["default-pinned"])["default-pinned"]
        assert "didn't match Pod's node affinity/selector" in message and "Insufficient nvidia.com/gpu" in message, \
            message
        assert_runtime_class_fits(cluster, fleet, admitted)
