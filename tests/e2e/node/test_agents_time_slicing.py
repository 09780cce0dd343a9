"""Chart-values-examples/time-slicing-t4-x4.yaml on a node with one mock T4: the chart's device plugin and GFD
DaemonSets run the upstream k8s-device-plugin v0.20.0 binaries (tests/e2e/node/agents.py says what stands in),
the webhook in front. What the real plugin advertises, labels, allocates and refuses is what the chart and the
webhook promise. One GPU, so that its four replicas are all the node has: a fifth pod finds none left."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from gpu_stack_dev.chartlib import overlay_values
from gpu_stack_dev.e2e import agent_images
from gpu_stack_dev.e2e.e2elib import E2ECluster, unique

from .agents import GpuRelease, allocatable, gpu_release, node_labels, plugin_verdict, webhook_verdict
from .standin import apply_pod, scratch_namespace, seen, wait_for

OVERLAY = "time-slicing-t4-x4.yaml"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
PLUGIN_REFUSAL = "maximum request size for shared resources is 1"


@pytest.fixture(scope="module")
def t4(cluster: E2ECluster, real_node: Any) -> Iterator[GpuRelease]:
    agent_images.load(real_node)
    with gpu_release(cluster, real_node, OVERLAY, "t4", gpus=1) as release:
        yield release


def replicas() -> int:
    config = overlay_values(OVERLAY)["sharing"]["configs"]["ts-t4-x4"]
    return int(config["timeSlicing"]["resources"][0]["replicas"])


def test_the_agents_pods_are_ready_without_restarts_or_error_lines(t4: GpuRelease) -> None:
    for component in ("device-plugin", "gpu-feature-discovery"):
        (pod,) = t4.pods(component)
        assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"
        assert [s["restartCount"] for s in pod["status"]["containerStatuses"]] == [0] * len(pod["spec"]["containers"])
        assert t4.error_lines(component) == {}


def test_allocatable_is_what_the_real_plugin_advertises_and_the_overlay_promises(
        t4: GpuRelease, real_node: Any) -> None:
    promised = str(t4.gpus.count * replicas())  # 1 T4 x 4 replicas
    assert wait_for(lambda: allocatable(real_node) == promised, f"allocatable nvidia.com/gpu {promised}")
    status = json.loads(real_node.kubectl("get", "node", real_node.node_name, "-o", "json").stdout)["status"]
    assert status["capacity"]["nvidia.com/gpu"] == promised


def test_gfd_labels_the_node_with_the_shared_product_and_its_replicas(t4: GpuRelease, real_node: Any) -> None:
    expected = {
        "nvidia.com/gpu.product": t4.gpus.product.replace(" ", "-") + "-SHARED",
        "nvidia.com/gpu.count": str(t4.gpus.count),
        "nvidia.com/gpu.memory": str(t4.gpus.memory_mib),
        "nvidia.com/gpu.replicas": str(replicas()),
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
        "nvidia.com/mps.capable": "false",
    }

    def labelled() -> bool:
        labels = node_labels(real_node)
        return all(labels.get(k) == v for k, v in expected.items())
    assert wait_for(labelled, f"GFD's labels {expected}", timeout=120), node_labels(real_node)


def test_four_pods_share_the_one_gpu_and_a_fifth_stays_pending(t4: GpuRelease, real_node: Any) -> None:
    """The kubelet hands each pod a replica from the real plugin; what reaches the container is the GPU's UUID
    (internal/plugin/server.go getAllocateResponse strips the replica suffix, v0.20.0)."""
    wait_for(lambda: allocatable(real_node) == str(replicas()), "every replica advertised")
    with scratch_namespace(real_node, unique("agents")) as namespace:
        for i in range(replicas() + 1):
            apply_pod(real_node, namespace, f"p{i}", gpus=1)
        (gpu,) = t4.gpus.uuids
        assert [seen(real_node, namespace, f"p{i}") for i in range(replicas())] == [
            (VOLUME_MOUNTS_ROOT, [gpu])] * replicas()

        def pending_reason() -> str | None:
            pod = json.loads(real_node.kubectl("get", "pod", "-n", namespace, f"p{replicas()}", "-o", "json").stdout)
            return next((str(c["message"]) for c in pod["status"].get("conditions") or ()
                         if c["type"] == "PodScheduled" and c["status"] == "False"), None)
        assert "Insufficient nvidia.com/gpu" in wait_for(pending_reason, "the fifth pod unschedulable")


def test_a_pod_the_webhook_admits_runs_with_the_device_the_real_plugin_allocated(
        t4: GpuRelease, real_node: Any) -> None:
    wait_for(lambda: allocatable(real_node) not in (None, "0"), "GPUs on the node")
    with scratch_namespace(real_node, unique("agents")) as namespace:
        before = t4.webhook_allowed()
        apply_pod(real_node, namespace, "gpu", gpus=1)
        assert t4.webhook_allowed() == before + 1  # the webhook's /validate admitted it, not only CEL
        visible, devices = seen(real_node, namespace, "gpu")
        assert visible == VOLUME_MOUNTS_ROOT
        assert len(devices) == 1 and devices[0] in t4.gpus.uuids  # a mock GPU's UUID, not a replica ID


def test_the_webhook_denies_exactly_the_requests_the_real_plugin_refuses(t4: GpuRelease, real_node: Any) -> None:
    """kube-system is exempt from the webhook: there the request reaches the kubelet and the real plugin's
    Allocate (k8s-device-plugin v0.20.0 internal/rm/rm.go: `maximum request size for shared resources is 1`).
    The webhook judges the same request pinned to the node (its config label, unset: sharing.defaultConfig);
    unpinned, the overlay's other config (the values' `default`) could take it, and GPU004 only warns."""
    wait_for(lambda: allocatable(real_node) == str(t4.gpus.count * replicas()), "every replica advertised")
    suffix = unique("req")
    try:
        for gpus in (1, 2, 3):
            plugin = plugin_verdict(real_node, "kube-system", f"{suffix}-{gpus}", gpus)
            refused = PLUGIN_REFUSAL in plugin
            assert refused == (gpus > 1), plugin
            with scratch_namespace(real_node, unique("agents")) as namespace:
                if not refused:
                    assert webhook_verdict(real_node, namespace, gpus, real_node.node_name).startswith("admitted")
                else:  # the node's label is looked up with a short timeout; unknown, GPU004 only warns
                    assert wait_for(lambda n=gpus: "GPU004" in webhook_verdict(real_node, namespace, n,
                                                                        real_node.node_name),
                                    f"the webhook denying {gpus} GPUs", timeout=60)
    finally:
        real_node.kubectl("delete", "pods", "-n", "kube-system", *(f"{suffix}-{n}" for n in (1, 2, 3)),
                          "--force", "--grace-period=0", "--ignore-not-found", check=False)


def test_the_agents_images_are_pulled_from_the_registry_with_its_pull_secret(t4: GpuRelease, real_node: Any) -> None:
    """As from a private registry or a mirror of nvcr.io: the image repositories point at the node's registry and
    `global.imagePullSecrets` names its secret; the kubelet pulled by name and runs the digest that was pushed."""
    served = agent_images.served(real_node)
    ref, digest = served.refs["device-plugin"], served.digests["device-plugin"]
    for component in ("device-plugin", "gpu-feature-discovery"):
        (pod,) = t4.pods(component)
        assert pod["spec"]["imagePullSecrets"] == [{"name": agent_images.PULL_SECRET}]
        statuses = pod["status"].get("initContainerStatuses", []) + pod["status"]["containerStatuses"]
        assert {c["image"] for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]} == {ref}
        assert {s["imageID"] for s in statuses} == {f"{ref.rsplit(':', 1)[0]}@{digest}"}
    assert ref in real_node.ctr("images", "ls", "-q").stdout.split()
    assert agent_images.refs()["device-plugin"] not in real_node.ctr("images", "ls", "-q").stdout.split()
