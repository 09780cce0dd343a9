"""Chart-values-examples/per-node-configs.yaml on a node with 4 mock T4s: the node's config switched through the
label nvidia.com/device-plugin.config reaches the real device plugin v0.20.0 (through the chart's config-manager
sidecar), and the webhook's verdicts follow it.

Here the sidecar cannot deliver its SIGHUP (each container is a gVisor sandbox of its own: `error finding pid`,
and it exits); the test sends that signal through containerd once the sidecar has switched the config file
(agents.GpuRelease.sighup). The sidecar's restarts after that are this machine's, not the chart's: they are not
asserted. migManager.enabled=false: the overlay's MIG manager is not what this test is about (test_agents_mig.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gpu_stack_dev.e2e import agent_images
from gpu_stack_dev.e2e.e2elib import E2ECluster, unique

from .agents import GpuRelease, allocatable, gpu_release, plugin_verdict, webhook_verdict
from .standin import scratch_namespace, wait_for

OVERLAY = "per-node-configs.yaml"
LABEL = "nvidia.com/device-plugin.config"
PLUGIN_REFUSAL = "maximum request size for shared resources is 1"


@pytest.fixture(scope="module")
def t4(cluster: E2ECluster, real_node: Any) -> Iterator[GpuRelease]:
    agent_images.load(real_node)
    with gpu_release(cluster, real_node, OVERLAY, "t4", **{"migManager.enabled": False}) as release:
        yield release


def selected_config(t4: GpuRelease) -> str:
    """Where the plugin container's /config/config.yaml points (config-manager keeps it a symlink)."""
    (pod,) = t4.pods("device-plugin")
    proc = t4.node.kubectl("exec", "-n", t4.release.namespace, pod["metadata"]["name"], "-c", "nvidia-device-plugin",
                           "--", "readlink", "/config/config.yaml", check=False)
    return proc.stdout.strip()


def test_a_config_label_reaches_the_real_plugin_and_the_webhook_follows(t4: GpuRelease, real_node: Any) -> None:
    gpus = t4.gpus.count
    assert wait_for(lambda: allocatable(real_node) == str(gpus), f"the default config's {gpus} GPUs")
    with scratch_namespace(real_node, unique("agents")) as namespace:
        assert webhook_verdict(real_node, namespace, 2, real_node.node_name).startswith("admitted")

    real_node.kubectl("label", "node", real_node.node_name, "--overwrite", f"{LABEL}=ts-x4")

    def switched() -> bool:
        if allocatable(real_node) == str(gpus * 4):
            return True
        if selected_config(t4).endswith("/ts-x4"):
            t4.sighup("device-plugin", "nvidia-device-plugin")
        return False
    assert wait_for(switched, "the plugin advertising ts-x4's 4 replicas per GPU", timeout=240)

    with scratch_namespace(real_node, unique("agents")) as namespace:  # the webhook caches a node's label 30 s
        assert wait_for(lambda: "GPU004" in webhook_verdict(real_node, namespace, 2, real_node.node_name),
                        "the webhook denying 2 GPUs on the ts-x4 node")
    name = unique("req")
    try:
        assert PLUGIN_REFUSAL in plugin_verdict(real_node, "kube-system", name, 2)
    finally:
        real_node.kubectl("delete", "pod", "-n", "kube-system", name, "--force", "--grace-period=0",
                          "--ignore-not-found", check=False)
