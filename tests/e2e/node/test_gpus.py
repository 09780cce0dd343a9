"""GPUs on a real kubelet: the stand-in device plugin (tests/e2e/deviceplugin) registered with the node's
device manager, pods run by containerd under gVisor. Uses the `real_node` fixture (tests/e2e/node/conftest.py;
each test skips without it) through `.kubectl(*args)`, `.kubelet_root`, `.node_name` and
`.run_in_netns(cmd)` (starts a process in the node's network namespace, returns its Popen).

The kubelet v1.36 serves its device plugin Registration on /var/lib/kubelet/device-plugins/kubelet.sock
whatever its --root-dir (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1 constants.go KubeletSocket, used
by pkg/kubelet/cm/devicemanager NewManagerImpl): one path for every kubelet on the machine. A node that
shares the machine runs its kubelet in a mount namespace of its own with a directory of its own
bind-mounted there, and gives that directory as `.device_plugin_dir` (the plugin's sockets and the
kubelet's are the same files through the bind mount); without it the tests use the real path. Pods run
`.busybox_image` (default localhost/busybox:1, what ../shared/node/node-up.sh imports).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gpu_stack_dev.chartlib import render
from gpu_stack_dev.e2e.fleet import ChartSharing, NodeSpec, plan

from tests.e2e.deviceplugin.model import VOLUME_MOUNTS_ROOT, NodePlugin, mps_root_of, node_plugin
from tests.e2e.deviceplugin.server import write_health

DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
# (overlay, GPU model, GPUs): measured on a kubelet v1.36.2 node, capacity == allocatable == the fleet's.
OVERLAYS = [
    ("default", "Tesla-T4", 2),
    ("time-slicing-t4-x4.yaml", "Tesla-T4", 1),
    ("mps-x10.yaml", "Tesla-T4", 1),
    ("mig-single-all-1g.yaml", "NVIDIA-A100-SXM4-40GB", 1),
    ("mig-mixed-all-balanced.yaml", "NVIDIA-A100-SXM4-40GB", 1),
]
# The container prints what the NVIDIA runtime would read: the variable and the device-list mounts.
SHOW_DEVICES = f"echo NVD=$NVIDIA_VISIBLE_DEVICES; ls {VOLUME_MOUNTS_ROOT} 2>/dev/null; echo END; sleep 3600"


@pytest.fixture
def node(request: pytest.FixtureRequest) -> Any:
    try:
        return request.getfixturevalue("real_node")
    except pytest.FixtureLookupError:
        pytest.skip("needs the real_node fixture (a kubelet + containerd node)")


def _wait(check: Callable[[], Any], what: str, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(1)


class StandIn:
    """The stand-in plugin process for one overlay on the node, its health file, and its device IDs."""

    def __init__(self, node: Any, tmp: Path, overlay: str, model: str, gpus: int) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.node, self.health = node, tmp / "health.json"
        rendered = render(4, overlay)
        objects = rendered.objects()
        self.sharing = ChartSharing.from_objects(objects)
        self.spec = NodeSpec(node.node_name, gpus=gpus, model=model)
        # GPUs of their own: the kubelet may still hold an earlier test's devices for pods it is cleaning up.
        seed = uuid.uuid4().hex
        self.plugin: NodePlugin = node_plugin(self.spec, self.sharing, mps_root=mps_root_of(objects), gpu_seed=seed)
        (tmp / "render.yaml").write_text(rendered.stdout, encoding="utf-8")
        write_health(self.health, [])
        plugin_dir = getattr(node, "device_plugin_dir", DEVICE_PLUGIN_DIR)
        # No device specs: the node has no /dev/nvidia* for containerd to pass.
        self.proc: subprocess.Popen[Any] = node.run_in_netns([
            sys.executable, "-m", "tests.e2e.deviceplugin", "--render", str(tmp / "render.yaml"),
            "--node", node.node_name, "--gpus", str(gpus), "--model", model, "--plugin-dir", str(plugin_dir),
            "--health-file", str(self.health), "--no-device-specs", "--gpu-seed", seed])

    def promised(self) -> dict[str, str]:
        return {k: v for k, v in plan(self.spec, self.sharing).resources.items() if k.startswith("nvidia.com/")}

    def stop(self) -> None:
        """Stop the plugin and wait until the kubelet has withdrawn its devices (allocatable 0), so that the
        next plugin's wait for its numbers cannot pass on this one's."""
        self.proc.terminate()
        self.proc.wait(timeout=30)
        gone = {name: "0" for name in self.promised()}
        _wait(lambda: _gpu_resources(self.node, gone)[1] == gone, "the stopped plugin's devices withdrawn")


@pytest.fixture
def standin(node: Any, tmp_path: Path) -> Iterator[Callable[[str, str, int], StandIn]]:
    started: list[StandIn] = []

    def start(overlay: str, model: str = "Tesla-T4", gpus: int = 1) -> StandIn:
        plugin = StandIn(node, tmp_path / f"plugin-{len(started)}", overlay, model, gpus)
        started.append(plugin)
        return plugin

    yield start
    for plugin in started:
        plugin.stop()


@pytest.fixture
def namespace(node: Any) -> Iterator[str]:
    name = f"gpus-{uuid.uuid4().hex[:8]}"
    node.kubectl("create", "namespace", name)
    yield name
    # Forced: the scheduler counts a terminating pod's GPUs until its object is gone.
    node.kubectl("delete", "pods", "--all", "-n", name, "--force", "--grace-period=0", "--wait=true")
    node.kubectl("delete", "namespace", name, "--wait=false")


def _status(node: Any) -> dict[str, Any]:
    return json.loads(node.kubectl("get", "node", node.node_name, "-o", "json").stdout)["status"]


def _gpu_resources(node: Any, promised: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) of the promised resources (a resource of an earlier plugin stays in capacity
    with allocatable 0 until the kubelet drops it)."""
    status = _status(node)
    return ({k: status["capacity"].get(k) for k in promised}, {k: status["allocatable"].get(k) for k in promised})


def _pod(node: Any, namespace: str, name: str, gpus: int | None, env: dict[str, str] | None = None,
         extra: dict[str, Any] | None = None) -> None:
    container: dict[str, Any] = {
        "name": "c", "image": getattr(node, "busybox_image", "localhost/busybox:1"), "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", SHOW_DEVICES]}
    if gpus is not None:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
           "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [container],
                    **(extra or {})}}
    node.kubectl("apply", "-f", "-", input=json.dumps(pod))


def _seen(node: Any, namespace: str, name: str) -> tuple[str, list[str]]:
    """(NVIDIA_VISIBLE_DEVICES, the entries under /var/run/nvidia-container-devices) inside the container."""
    def logs() -> str | None:
        out = node.kubectl("logs", "-n", namespace, name, check=False)
        return out.stdout if out.returncode == 0 and "END" in out.stdout else None
    lines = _wait(logs, f"{name}'s output").splitlines()
    return lines[0].removeprefix("NVD="), lines[1:lines.index("END")]


@pytest.mark.parametrize(("overlay", "model", "gpus"), OVERLAYS)
def test_capacity_and_allocatable_are_what_the_chart_and_the_fleet_promise(
        node: Any, standin: Callable[..., StandIn], overlay: str, model: str, gpus: int) -> None:
    plugin = standin(overlay, model, gpus)
    promised = plugin.promised()
    assert promised == {r.name: str(len(r.devices)) for r in plugin.plugin.resources}
    _wait(lambda: _gpu_resources(node, promised) == (promised, promised), f"{promised} on {node.node_name}")


def test_each_container_sees_exactly_the_devices_allocated_to_it(
        node: Any, standin: Callable[..., StandIn], namespace: str) -> None:
    plugin = standin("default", "Tesla-T4", 2)
    gpus = {d.id for d in plugin.plugin.resources[0].devices}
    _wait(lambda: _gpu_resources(node, plugin.promised())[1] == plugin.promised(), "2 GPUs")
    for name in ("a", "b"):
        _pod(node, namespace, name, gpus=1)
    seen = {name: _seen(node, namespace, name) for name in ("a", "b")}
    assert {env for env, _ in seen.values()} == {VOLUME_MOUNTS_ROOT}
    (a,), (b,) = seen["a"][1], seen["b"][1]
    assert {a, b} == gpus  # one GPU each, never the same one


def test_the_fifth_pod_on_time_slicing_t4_x4_stays_pending(
        node: Any, standin: Callable[..., StandIn], namespace: str) -> None:
    plugin = standin("time-slicing-t4-x4.yaml", "Tesla-T4", 1)
    _wait(lambda: _gpu_resources(node, plugin.promised())[1] == {"nvidia.com/gpu": "4"}, "4 replicas")
    for i in range(5):
        _pod(node, namespace, f"p{i}", gpus=1)
    replicas_of = {d.base_id for d in plugin.plugin.resources[0].devices}
    running = [_seen(node, namespace, f"p{i}") for i in range(4)]
    assert all(mounts == sorted(replicas_of) for _, mounts in running)  # the GPU, not the replica ID

    def pending_reason() -> str | None:
        pod = json.loads(node.kubectl("get", "pod", "-n", namespace, "p4", "-o", "json").stdout)
        for c in pod["status"].get("conditions") or ():
            if c["type"] == "PodScheduled" and c["status"] == "False":
                return str(c["message"])
        return None
    assert "Insufficient nvidia.com/gpu" in _wait(pending_reason, "p4 unschedulable")


def test_the_pod_spec_env_wins_over_the_plugins_nvidia_visible_devices(
        node: Any, standin: Callable[..., StandIn], namespace: str) -> None:
    """The kubelet puts the plugin's envs first and the container's env after them
    (pkg/kubelet/kubelet_pods.go GenerateRunContainerOptions); the last value is what the container sees."""
    plugin = standin("default", "Tesla-T4", 1)
    _wait(lambda: _gpu_resources(node, plugin.promised())[1] == plugin.promised(), "1 GPU")
    _pod(node, namespace, "gpu", gpus=1, env={"NVIDIA_VISIBLE_DEVICES": "all"})
    _pod(node, namespace, "nogpu", gpus=None, env={"NVIDIA_VISIBLE_DEVICES": "all"})
    (gpu,) = (d.id for d in plugin.plugin.resources[0].devices)
    assert _seen(node, namespace, "gpu") == ("all", [gpu])
    assert _seen(node, namespace, "nogpu") == ("all", [])


def test_an_unknown_runtime_class_handler_leaves_the_pod_in_container_creating(
        node: Any, standin: Callable[..., StandIn], namespace: str) -> None:
    plugin = standin("default", "Tesla-T4", 1)
    _wait(lambda: _gpu_resources(node, plugin.promised())[1] == plugin.promised(), "1 GPU")
    handler = f"gs-unknown-{uuid.uuid4().hex[:6]}"
    node.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": handler}, "handler": handler}))
    try:
        _pod(node, namespace, "rc", gpus=1, extra={"runtimeClassName": handler})

        def sandbox_failure() -> str | None:
            events = json.loads(node.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
            return next((e["message"] for e in events if e["reason"] == "FailedCreatePodSandBox"), None)
        message = _wait(sandbox_failure, "FailedCreatePodSandBox")
        assert f'no runtime for "{handler}" is configured' in message
        pod = json.loads(node.kubectl("get", "pod", "-n", namespace, "rc", "-o", "json").stdout)
        assert pod["status"]["phase"] == "Pending" and pod["spec"]["nodeName"] == node.node_name
    finally:
        node.kubectl("delete", "runtimeclass", handler, "--wait=false")


def test_an_unhealthy_device_drops_allocatable_until_it_is_healthy_again(
        node: Any, standin: Callable[..., StandIn]) -> None:
    plugin = standin("default", "Tesla-T4", 2)
    _wait(lambda: _gpu_resources(node, plugin.promised()) == ({"nvidia.com/gpu": "2"},) * 2, "2 GPUs")
    (resource, victim), = plugin.plugin.xid_victim(plugin.plugin.gpu_uuids()[1])
    write_health(plugin.health, [victim])
    _wait(lambda: _gpu_resources(node, plugin.promised()) == ({resource: "2"}, {resource: "1"}),
          "allocatable 1 of capacity 2")
    write_health(plugin.health, [])
    _wait(lambda: _gpu_resources(node, plugin.promised()) == ({resource: "2"},) * 2, "allocatable back to 2")
