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

from .e2elib import E2ECluster, LiveWebhook, Releases, unique
from .fleet import (
    FULL_GPU,
    MPS_TAINT,
    ChartSharing,
    Fleet,
    NodeSpec,
    delete_pods,
    wait_scheduled,
)

CUDA_IMAGE = "nvcr.io/nvidia/cuda:12.9.1-base-ubuntu24.04"


def gpu_pod(fleet: Fleet, name: str, gpus: int = 1, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A GPU pod as README.md shows: a limit on nvidia.com/gpu, nothing else about GPUs; plus the
    toleration of this test's fleet (isolation from other tests' pods, see fleet.Fleet)."""
    meta: dict[str, Any] = {"name": name, **({"annotations": annotations} if annotations else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"restartPolicy": "Never", "tolerations": [fleet.toleration],
                     "containers": [{"name": "cuda", "image": CUDA_IMAGE, "command": ["nvidia-smi"],
                                     "resources": {"limits": {FULL_GPU: gpus}}}]}}


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
    mps, plain, cpu = unique("mps"), unique("plain"), unique("cpu")
    specs = [NodeSpec(mps, gpus=1, model="NVIDIA-L4"),  # unlabelled: the overlay's default config, mps-x10
             NodeSpec(plain, gpus=1, model="NVIDIA-L4", config="default"),  # exclusive GPUs
             NodeSpec(cpu)]
    with placement(cluster, releases, live_webhook, "mps-x10.yaml", specs) as (ns, fleet):
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
