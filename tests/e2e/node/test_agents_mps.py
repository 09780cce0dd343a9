"""Chart-values-examples/mps-x10.yaml on a node with 4 mock T4s: the real GFD labels the node MPS-capable, the
chart's MPS control daemon DaemonSet starts there with the upstream mps-control-daemon v0.20.0, and its liveness
probe fails once the daemon stops answering. nvidia-cuda-mps-control is proprietary: a stand-in script
(gpu_stack_dev.e2e.mock_gpu) answers while its daemon runs; tests/e2e/node/agents.py lists the other stand-ins.

The webhook's changes are what the kubelet acts on. The node is tainted as the overlay tells admins to taint MPS
nodes, and a user's pod asks for `nvidia.com/gpu: 1` in requests only, with no toleration, no hostIPC and no
runtime class. What the kubelet and containerd do with the admitted pod is read where they act:
- the filled limit: the kubelet allocates a replica from the real plugin, and the container holds its Allocate
  answer (the MPS daemon's pipe directory and the GPU's device-list mount);
- the MPS toleration: the pod is scheduled onto the tainted node, where a pod without it is refused;
- hostIPC: the OCI spec containerd writes for the pod's sandbox has no IPC namespace of its own;
- `runtimeClassName: nvidia`: containerd creates both through the node's `nvidia` handler, a stand-in for the
  NVIDIA runtime that records the spec it was given (hack/node/nvidia-runtime-standin)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpu_stack_dev.e2e import agent_images
from gpu_stack_dev.e2e.e2elib import E2ECluster, unique

from .agents import GpuRelease, allocatable, gpu_release, node_labels
from .standin import printed, scratch_namespace, wait_for

OVERLAY = "mps-x10.yaml"
REPLICAS = 10
# where v0.20.0's daemon keeps the nvidia.com/gpu daemon (cmd/mps-control-daemon/mps/root.go)
PIPE_DIR = "/mps/nvidia.com/gpu/pipe"
MPS_TAINT = "gpu-stack.io/mps"  # the taint mps-x10.yaml's header tells admins to set
# A namespace the webhook leaves alone (webhook.policy.extraExemptNamespaces): the same pod without the changes.
EXEMPT_NAMESPACE = "patches-exempt"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
SHOW = (f"echo MPS=$CUDA_MPS_PIPE_DIRECTORY; echo NVD=$NVIDIA_VISIBLE_DEVICES; ls {VOLUME_MOUNTS_ROOT}; "
        "echo END; sleep 3600")


@pytest.fixture(scope="module")
def mps(cluster: E2ECluster, real_node: Any) -> Iterator[GpuRelease]:
    agent_images.load(real_node)
    with gpu_release(cluster, real_node, OVERLAY, "t4",
                     **{"webhook.policy.extraExemptNamespaces": [EXEMPT_NAMESPACE]}) as release:
        real_node.kubectl("taint", "node", real_node.node_name, f"{MPS_TAINT}=:NoSchedule")
        try:
            yield release
        finally:
            real_node.kubectl("taint", "node", real_node.node_name, f"{MPS_TAINT}-", check=False)


@pytest.fixture
def namespace(real_node: Any) -> Iterator[str]:
    with scratch_namespace(real_node, unique("patches")) as name:
        yield name


def daemon_pod(mps: GpuRelease) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        for pod in mps.pods("mps-control-daemon"):
            if {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}.get("Ready") == "True":
                return pod
        return None
    pod: dict[str, Any] = wait_for(ready, "the MPS control daemon pod Ready", timeout=180)
    return pod


def test_gfd_labels_the_node_mps_capable_and_the_daemon_starts_there(mps: GpuRelease, real_node: Any) -> None:
    expected = {"nvidia.com/mps.capable": "true", "nvidia.com/gpu.sharing-strategy": "mps",
                "nvidia.com/gpu.replicas": str(REPLICAS)}
    assert wait_for(lambda: all(node_labels(real_node).get(k) == v for k, v in expected.items()),
                    f"GFD's labels {expected}", timeout=120)
    pod = daemon_pod(mps)
    assert pod["spec"]["nodeName"] == real_node.node_name
    assert mps.error_lines("mps-control-daemon") == {}


def test_allocatable_is_what_the_real_plugin_advertises(mps: GpuRelease, real_node: Any) -> None:
    promised = str(mps.gpus.count * REPLICAS)
    assert wait_for(lambda: allocatable(real_node) == promised, f"allocatable {promised}", timeout=180)


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


def test_a_gpu_pod_runs_as_the_webhook_changed_it(mps: GpuRelease, real_node: Any, namespace: str) -> None:
    wait_for(lambda: allocatable(real_node) == str(mps.gpus.count * REPLICAS), "every MPS replica advertised",
             timeout=180)
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

    # The kubelet allocated one replica: the real plugin's MPS Allocate answer is in the container
    # (internal/plugin/mps.go updateReponse, v0.20.0), with the GPU the replica belongs to.
    mps_line, visible, gpu = printed(real_node, namespace, "client", timeout=120)
    assert (mps_line, visible) == (f"MPS={PIPE_DIR}", f"NVD={VOLUME_MOUNTS_ROOT}") and gpu in mps.gpus.uuids

    # containerd created the sandbox and the container through the `nvidia` handler, with the host's IPC.
    records = _runtime_records(real_node.nvidia_runtime_log, namespace, "client")
    assert set(records) == {"sandbox", "container"}, records
    # hostIPC: the sandbox gets no IPC namespace of its own, and the container joins the sandbox's (Debian's
    # containerd 1.6; without hostIPC the sandbox's spec asks for a new one: test below).
    assert records["sandbox"]["ipcNamespace"] is None
    assert records["container"]["ipcNamespace"]["path"].endswith("/ns/ipc")
    # What the NVIDIA runtime would read from the container: the plugin's device-list mount for that GPU.
    assert records["container"]["NVIDIA_VISIBLE_DEVICES"] == [VOLUME_MOUNTS_ROOT]
    assert records["container"]["deviceListMounts"] == [f"{VOLUME_MOUNTS_ROOT}/{gpu}"]


def test_a_pod_without_the_mps_toleration_is_kept_off_the_mps_node(
        mps: GpuRelease, real_node: Any, namespace: str) -> None:
    """The taint is real: a pod the webhook leaves alone (no GPU) cannot land on the MPS node."""
    real_node.kubectl("apply", "-f", "-", input=_pod("plain", namespace, real_node.busybox_image, None))

    def unschedulable() -> str | None:
        pod = json.loads(real_node.kubectl("get", "pod", "-n", namespace, "plain", "-o", "json").stdout)
        return next((str(c["message"]) for c in pod["status"].get("conditions") or ()
                     if c["type"] == "PodScheduled" and c["status"] == "False"), None)
    assert "1 node(s) had untolerated taint(s)" in wait_for(unschedulable, "plain unschedulable")
    assert _runtime_records(real_node.nvidia_runtime_log, namespace, "plain") == {}


def test_the_same_pod_without_the_webhook_keeps_a_private_ipc_namespace(mps: GpuRelease, real_node: Any) -> None:
    """In a namespace the webhook leaves alone, a pod that already names the limit, the toleration and the
    runtime class (but not hostIPC) runs as written: its sandbox asks for an IPC namespace of its own."""
    with scratch_namespace(real_node, EXEMPT_NAMESPACE) as namespace:
        created = real_node.kubectl("apply", "-f", "-", input=_pod(
            "as-written", namespace, real_node.busybox_image, {"limits": {"nvidia.com/gpu": "1"}},
            runtimeClassName="nvidia", tolerations=[{"key": MPS_TAINT, "operator": "Exists", "effect": "NoSchedule"}]))
        assert "Warning:" not in created.stderr
        assert printed(real_node, namespace, "as-written", timeout=120)[0] == f"MPS={PIPE_DIR}"
        records = _runtime_records(real_node.nvidia_runtime_log, namespace, "as-written")
        assert records["sandbox"]["ipcNamespace"] == {"type": "ipc"}


def liveness(real_node: Any, pod: dict[str, Any]) -> int:
    """Exit code of the chart's livenessProbe command, run in the daemon's container as the kubelet runs it."""
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "mps-control-daemon"]
    proc = real_node.kubectl("exec", "-n", pod["metadata"]["namespace"], pod["metadata"]["name"], "-c",
                             "mps-control-daemon", "--", *container["livenessProbe"]["exec"]["command"], check=False)
    return int(proc.returncode)


def test_the_liveness_probe_fails_once_the_daemon_stops_answering(mps: GpuRelease, real_node: Any) -> None:
    pod = daemon_pod(mps)
    name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
    assert liveness(real_node, pod) == 0
    real_node.kubectl("exec", "-n", namespace, name, "-c", "mps-control-daemon", "--", "sh", "-c",
                      f"echo quit | CUDA_MPS_PIPE_DIRECTORY={PIPE_DIR} nvidia-cuda-mps-control")
    assert liveness(real_node, pod) != 0

    def probe_failed() -> bool:
        events = json.loads(real_node.kubectl("get", "events", "-n", namespace, "--field-selector",
                                              f"involvedObject.name={name}", "-o", "json").stdout)["items"]
        return any(e["reason"] == "Unhealthy" and "Liveness probe failed" in e["message"] for e in events)
    assert wait_for(probe_failed, "the kubelet's liveness probe failing", timeout=120)
