"""Chart-values-examples/exclusive.yaml on a node with 8 mock A100s: the chart's device plugin and GFD DaemonSets
run the upstream k8s-device-plugin v0.20.0 binaries (tests/e2e/node/agents.py says what stands in), the webhook in
front. Every GPU is one nvidia.com/gpu; a pod that asks for two gets two different GPUs from the real Allocate."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from gpu_stack_dev.e2e import agent_images
from gpu_stack_dev.e2e.e2elib import E2ECluster, unique

from .agents import GpuRelease, allocatable, gpu_release, node_labels, plugin_verdict, webhook_verdict
from .standin import apply_pod, scratch_namespace, seen, wait_for

OVERLAY = "exclusive.yaml"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"


@pytest.fixture(scope="module")
def a100(cluster: E2ECluster, real_node: Any) -> Iterator[GpuRelease]:
    agent_images.load(real_node)
    with gpu_release(cluster, real_node, OVERLAY, "a100") as release:
        yield release


def test_the_agents_pods_are_ready_without_restarts_or_error_lines(a100: GpuRelease) -> None:
    for component in ("device-plugin", "gpu-feature-discovery"):
        (pod,) = a100.pods(component)
        assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"
        assert all(s["restartCount"] == 0 for s in pod["status"]["containerStatuses"])
        assert a100.error_lines(component) == {}


def test_allocatable_is_one_per_gpu(a100: GpuRelease, real_node: Any) -> None:
    assert wait_for(lambda: allocatable(real_node) == str(a100.gpus.count), f"allocatable {a100.gpus.count}")
    status = json.loads(real_node.kubectl("get", "node", real_node.node_name, "-o", "json").stdout)["status"]
    assert status["capacity"]["nvidia.com/gpu"] == str(a100.gpus.count)


def test_gfd_labels_the_node_with_the_product_and_no_sharing(a100: GpuRelease, real_node: Any) -> None:
    expected = {
        "nvidia.com/gpu.product": a100.gpus.product.replace(" ", "-"),
        "nvidia.com/gpu.count": str(a100.gpus.count),
        "nvidia.com/gpu.memory": str(a100.gpus.memory_mib),
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mps.capable": "false",
    }

    def labelled() -> bool:
        labels = node_labels(real_node)
        return all(labels.get(k) == v for k, v in expected.items())
    assert wait_for(labelled, f"GFD's labels {expected}", timeout=120), node_labels(real_node)


def test_a_two_gpu_pod_gets_two_different_gpus_from_the_real_allocate(a100: GpuRelease, real_node: Any) -> None:
    wait_for(lambda: allocatable(real_node) == str(a100.gpus.count), "every GPU advertised")
    with scratch_namespace(real_node, unique("agents")) as namespace:
        assert webhook_verdict(real_node, namespace, 2).startswith("admitted")
        before = a100.webhook_allowed()
        apply_pod(real_node, namespace, "two", gpus=2)
        assert a100.webhook_allowed() == before + 1  # the webhook's /validate admitted it, not only CEL
        visible, devices = seen(real_node, namespace, "two")
        assert visible == VOLUME_MOUNTS_ROOT
        assert len(set(devices)) == 2 and set(devices) <= set(a100.gpus.uuids)


def test_the_real_plugin_refuses_nothing_the_webhook_admits(a100: GpuRelease, real_node: Any) -> None:
    wait_for(lambda: allocatable(real_node) == str(a100.gpus.count), "every GPU advertised")
    name = unique("req")
    try:
        assert plugin_verdict(real_node, "kube-system", name, 3) == "runs"
    finally:
        real_node.kubectl("delete", "pod", "-n", "kube-system", name, "--force", "--grace-period=0",
                          "--ignore-not-found", check=False)


def test_each_pod_sees_exactly_the_gpu_allocated_to_it(a100: GpuRelease, real_node: Any) -> None:
    wait_for(lambda: allocatable(real_node) == str(a100.gpus.count), "every GPU advertised")
    with scratch_namespace(real_node, unique("agents")) as namespace:
        for name in ("a", "b"):
            apply_pod(real_node, namespace, name, gpus=1)
        (a, (gpu_a,)), (b, (gpu_b,)) = (seen(real_node, namespace, name) for name in ("a", "b"))
    assert a == b == VOLUME_MOUNTS_ROOT
    assert gpu_a != gpu_b and {gpu_a, gpu_b} <= set(a100.gpus.uuids)


def test_the_pod_spec_env_wins_over_the_real_plugins_nvidia_visible_devices(a100: GpuRelease, real_node: Any) -> None:
    """The kubelet puts the plugin's envs first and the container's env after them (pkg/kubelet/kubelet_pods.go
    GenerateRunContainerOptions, v1.36); the last value is what the container sees, so a pod that sets the
    variable overrides the real Allocate's answer. This is why the webhook refuses it (GPU002): kube-system is
    exempt, so the pod gets there as written."""
    wait_for(lambda: allocatable(real_node) == str(a100.gpus.count), "every GPU advertised")
    name = unique("env")
    try:
        apply_pod(real_node, "kube-system", name, gpus=1, env={"NVIDIA_VISIBLE_DEVICES": "all"})
        visible, devices = seen(real_node, "kube-system", name)
        assert visible == "all" and len(devices) == 1 and devices[0] in a100.gpus.uuids
    finally:
        real_node.kubectl("delete", "pod", "-n", "kube-system", name, "--force", "--grace-period=0",
                          "--ignore-not-found", check=False)
