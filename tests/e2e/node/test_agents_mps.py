"""Chart-values-examples/mps-x10.yaml on a node with 4 mock T4s: the real GFD labels the node MPS-capable, the
chart's MPS control daemon DaemonSet starts there with the upstream mps-control-daemon v0.20.0, and its liveness
probe fails once the daemon stops answering. nvidia-cuda-mps-control is proprietary: a stand-in script
(gpu_stack_dev.e2e.mock_gpu) answers while its daemon runs; tests/e2e/node/agents.py lists the other stand-ins."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from gpu_stack_dev.e2e import agent_images
from gpu_stack_dev.e2e.e2elib import E2ECluster, unique

from .agents import GpuRelease, allocatable, gpu_release, node_labels
from .standin import apply_pod, scratch_namespace, seen, wait_for

OVERLAY = "mps-x10.yaml"
REPLICAS = 10
# where v0.20.0's daemon keeps the nvidia.com/gpu daemon (cmd/mps-control-daemon/mps/root.go)
PIPE_DIR = "/mps/nvidia.com/gpu/pipe"


@pytest.fixture(scope="module")
def mps(cluster: E2ECluster, real_node: Any) -> Iterator[GpuRelease]:
    agent_images.load(real_node)
    with gpu_release(cluster, real_node, OVERLAY, "t4") as release:
        yield release


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


def test_a_pod_the_webhook_admits_gets_the_real_plugins_mps_answer(mps: GpuRelease, real_node: Any) -> None:
    """The kubelet hands the container the real plugin's MPS Allocate answer: the daemon's pipe directory
    (internal/plugin/mps.go updateReponse, v0.20.0) and the GPU the replica belongs to."""
    wait_for(lambda: allocatable(real_node) == str(mps.gpus.count * REPLICAS), "every MPS replica advertised",
             timeout=180)
    with scratch_namespace(real_node, unique("agents")) as namespace:
        before = mps.webhook_allowed()
        apply_pod(real_node, namespace, "client", gpus=1)
        assert mps.webhook_allowed() == before + 1  # the webhook's /validate admitted it, not only CEL
        visible, devices = seen(real_node, namespace, "client")
        assert visible == "/var/run/nvidia-container-devices" and len(devices) == 1 and devices[0] in mps.gpus.uuids
        pipe = real_node.kubectl("exec", "-n", namespace, "client", "--", "sh", "-c",
                                 "echo $CUDA_MPS_PIPE_DIRECTORY")
        assert pipe.stdout.strip() == PIPE_DIR


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
