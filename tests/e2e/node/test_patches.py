"""The webhook's changes are what the kubelet acts on, on the real node: the chart installed with
mps-x10.yaml (its webhook pods serving through the Service), the stand-in device plugin serving that
overlay's MPS replicas, and the node tainted as the overlay tells admins to taint MPS nodes. A user's pod
asks for `nvidia.com/gpu: 1` in requests only, with no toleration, no hostIPC and no runtime class.

What the kubelet and containerd then do with the admitted pod is read where they act:
- the filled limit: the kubelet allocates a device from the plugin (the container holds the plugin's
  Allocate answer: the MPS pipe directory and the GPU's device-list mount);
- the MPS toleration: the pod is scheduled onto the tainted node, where a pod without it is refused;
- hostIPC: the OCI spec containerd writes for the pod's sandbox has no IPC namespace of its own;
- `runtimeClassName: nvidia`: containerd creates both through the node's `nvidia` handler, a stand-in for
  the NVIDIA runtime that records the spec it was given (hack/node/nvidia-runtime-standin).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpu_stack_dev.e2e.e2elib import E2ECluster, Releases, unique
from gpu_stack_dev.e2e.node_install import TEST_NAMESPACE

from tests.e2e.deviceplugin.model import MPS_CONTAINER_ROOT, VOLUME_MOUNTS_ROOT

from .conftest import install_and_wait
from .standin import StandIn, gpu_resources, printed, scratch_namespace, wait_for

OVERLAY = "mps-x10.yaml"
MPS_TAINT = "gpu-stack.io/mps"  # the taint mps-x10.yaml's header tells admins to set
# A namespace the webhook leaves alone (webhook.policy.extraExemptNamespaces): the same pod without the changes.
EXEMPT_NAMESPACE = "patches-exempt"
PIPE_DIRECTORY = f"{MPS_CONTAINER_ROOT}/nvidia.com/gpu/pipe"
SHOW = (f"echo MPS=$CUDA_MPS_PIPE_DIRECTORY; echo NVD=$NVIDIA_VISIBLE_DEVICES; ls {VOLUME_MOUNTS_ROOT}; "
        "echo END; sleep 3600")


@pytest.fixture(scope="module")
def mps_node(real_node: Any, cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    helper = Releases(cluster)
    if cluster.kubectl("get", "namespace", TEST_NAMESPACE, check=False).returncode:  # another module made it
        cluster.create_namespace(TEST_NAMESPACE)
    plugin: StandIn | None = None
    try:
        install_and_wait(helper, OVERLAY, namespace="gpu-stack",
                         **{"webhook.policy.extraExemptNamespaces": [EXEMPT_NAMESPACE]})
        plugin = StandIn(real_node, tmp_path_factory.mktemp("mps-plugin"), OVERLAY, "Tesla-T4", 1)
        wait_for(lambda: gpu_resources(real_node, plugin.promised())[1] == {"nvidia.com/gpu": "10"}, "10 MPS replicas")
        real_node.kubectl("taint", "node", real_node.node_name, f"{MPS_TAINT}=:NoSchedule")
        yield plugin
    finally:
        real_node.kubectl("taint", "node", real_node.node_name, f"{MPS_TAINT}-", check=False)
        if plugin is not None:
            plugin.stop()
        helper.cleanup()


@pytest.fixture
def namespace(real_node: Any) -> Iterator[str]:
    with scratch_namespace(real_node, unique("patches")) as name:
        yield name


def _pod(name: str, namespace: str, image: str, resources: dict[str, Any] | None, **spec: Any) -> str:
    container: dict[str, Any] = {"name": "c", "image": image, "imagePullPolicy": "Never",
                                 "command": ["/bin/sh", "-c", SHOW]}
    if resources:
        container["resources"] = resources
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
                       "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                                "containers": [container], **spec}})


def _runtime_records(path: Path, namespace: str, pod: str) -> dict[str, dict[str, Any]]:
    """The nvidia handler's records of this pod's sandbox and containers, by container type."""
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    records = [json.loads(line) for line in lines]
    return {r["annotations"].get("io.kubernetes.cri.container-type", ""): r for r in records
            if r["annotations"].get("io.kubernetes.cri.sandbox-namespace") == namespace
            and r["annotations"].get("io.kubernetes.cri.sandbox-name") == pod}


def test_a_gpu_pod_runs_as_the_webhook_changed_it(real_node: Any, mps_node: StandIn, namespace: str) -> None:
    created = real_node.kubectl("apply", "-f", "-", input=_pod(
        "client", namespace, real_node.busybox_image, {"requests": {"nvidia.com/gpu": "1"}}))
    warnings = [line for line in created.stderr.splitlines() if line.startswith("Warning: ")]
    for change in ("set GPU limit nvidia.com/gpu=1 from its request", "hostIPC=true for MPS",
                   f"added MPS toleration {MPS_TAINT}", "set runtimeClassName nvidia"):
        assert any(change in line for line in warnings), (change, created.stderr)

    spec = json.loads(real_node.kubectl("get", "pod", "-n", namespace, "client", "-o", "json").stdout)["spec"]
    assert spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert spec["hostIPC"] is True and spec["runtimeClassName"] == "nvidia"
    assert any(t.get("key") == MPS_TAINT for t in spec["tolerations"])

    # The kubelet allocated one replica of the one GPU: the plugin's Allocate answer is in the container.
    (gpu,) = mps_node.plugin.gpu_uuids()
    assert printed(real_node, namespace, "client", timeout=120) == [
        f"MPS={PIPE_DIRECTORY}", f"NVD={VOLUME_MOUNTS_ROOT}", gpu]

    # containerd created the sandbox and the container through the `nvidia` handler, with the host's IPC.
    records = _runtime_records(real_node.nvidia_runtime_log, namespace, "client")
    assert set(records) == {"sandbox", "container"}, records
    # hostIPC: the sandbox gets no IPC namespace of its own, and the container joins the sandbox's (Debian's
    # containerd 1.6; without hostIPC the sandbox's spec asks for a new one: the next test).
    assert records["sandbox"]["ipcNamespace"] is None
    assert records["container"]["ipcNamespace"]["path"].endswith("/ns/ipc")
    # What the NVIDIA runtime would read from the container: the plugin's device-list mount for that GPU.
    assert records["container"]["NVIDIA_VISIBLE_DEVICES"] == [VOLUME_MOUNTS_ROOT]
    assert records["container"]["deviceListMounts"] == [f"{VOLUME_MOUNTS_ROOT}/{gpu}"]


def test_a_pod_without_the_mps_toleration_is_kept_off_the_mps_node(
        real_node: Any, mps_node: StandIn, namespace: str) -> None:
    """The taint is real: a pod the webhook leaves alone (no GPU) cannot land on the MPS node."""
    real_node.kubectl("apply", "-f", "-", input=_pod("plain", namespace, real_node.busybox_image, None))

    def unschedulable() -> str | None:
        pod = json.loads(real_node.kubectl("get", "pod", "-n", namespace, "plain", "-o", "json").stdout)
        return next((str(c["message"]) for c in pod["status"].get("conditions") or ()
                     if c["type"] == "PodScheduled" and c["status"] == "False"), None)
    assert "1 node(s) had untolerated taint(s)" in wait_for(unschedulable, "plain unschedulable")
    assert _runtime_records(real_node.nvidia_runtime_log, namespace, "plain") == {}


def test_the_same_pod_without_the_webhook_keeps_a_private_ipc_namespace(real_node: Any, mps_node: StandIn) -> None:
    """In a namespace the webhook leaves alone, a pod that already names the limit, the toleration and the
    runtime class (but not hostIPC) runs as written: its sandbox asks for an IPC namespace of its own."""
    with scratch_namespace(real_node, EXEMPT_NAMESPACE) as namespace:
        created = real_node.kubectl("apply", "-f", "-", input=_pod(
            "as-written", namespace, real_node.busybox_image, {"limits": {"nvidia.com/gpu": "1"}},
            runtimeClassName="nvidia", tolerations=[{"key": MPS_TAINT, "operator": "Exists", "effect": "NoSchedule"}]))
        assert "Warning:" not in created.stderr
        assert printed(real_node, namespace, "as-written", timeout=120)[0] == f"MPS={PIPE_DIRECTORY}"
        records = _runtime_records(real_node.nvidia_runtime_log, namespace, "as-written")
        assert records["sandbox"]["ipcNamespace"] == {"type": "ipc"}
