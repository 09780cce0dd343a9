"""The stand-in device plugin on the real node and the pods that read what they were given, shared by the
node tests (the stand-in in test_gpus.py and test_patches.py; the pod helpers everywhere). `node` is the
real_node fixture's Node."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpu_stack_dev.chartlib import render
from gpu_stack_dev.e2e.fleet import ChartSharing, NodeSpec, plan

from tests.e2e.deviceplugin.model import VOLUME_MOUNTS_ROOT, NodePlugin, mps_root_of, node_plugin

DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
# The container prints what the NVIDIA runtime would read: the variable and the device-list mounts.
SHOW_DEVICES = f"echo NVD=$NVIDIA_VISIBLE_DEVICES; ls {VOLUME_MOUNTS_ROOT} 2>/dev/null; echo END; sleep 3600"


def wait_for(check: Callable[[], Any], what: str, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(1)


class StandIn:
    """The stand-in plugin process for one overlay on the node, and its device IDs."""

    def __init__(self, node: Any, tmp: Path, overlay: str, model: str, gpus: int) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.node = node
        rendered = render(4, overlay)
        objects = rendered.objects()
        self.sharing = ChartSharing.from_objects(objects)
        self.spec = NodeSpec(node.node_name, gpus=gpus, model=model)
        # GPUs of their own: the kubelet may still hold an earlier test's devices for pods it is cleaning up.
        seed = uuid.uuid4().hex
        self.plugin: NodePlugin = node_plugin(self.spec, self.sharing, mps_root=mps_root_of(objects), gpu_seed=seed)
        (tmp / "render.yaml").write_text(rendered.stdout, encoding="utf-8")
        plugin_dir = getattr(node, "device_plugin_dir", DEVICE_PLUGIN_DIR)
        # No device specs: the node has no /dev/nvidia* for containerd to pass.
        self.proc: subprocess.Popen[Any] = node.run_in_netns([
            sys.executable, "-m", "tests.e2e.deviceplugin", "--render", str(tmp / "render.yaml"),
            "--node", node.node_name, "--gpus", str(gpus), "--model", model, "--plugin-dir", str(plugin_dir),
            "--no-device-specs", "--gpu-seed", seed])

    def promised(self) -> dict[str, str]:
        return {k: v for k, v in plan(self.spec, self.sharing).resources.items() if k.startswith("nvidia.com/")}

    def stop(self) -> None:
        """Stop the plugin and wait until the kubelet has withdrawn its devices (allocatable 0), so that the
        next plugin's wait for its numbers cannot pass on this one's."""
        self.proc.terminate()
        self.proc.wait(timeout=30)
        gone = {name: "0" for name in self.promised()}
        wait_for(lambda: gpu_resources(self.node, gone)[1] == gone, "the stopped plugin's devices withdrawn")


@contextlib.contextmanager
def scratch_namespace(node: Any, name: str) -> Iterator[str]:
    """The namespace `name` for a test's pods, deleted with them after."""
    node.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        # Forced: the scheduler counts a terminating pod's GPUs until its object is gone.
        node.kubectl("delete", "pods", "--all", "-n", name, "--force", "--grace-period=0", "--wait=true")
        node.kubectl("delete", "namespace", name, "--wait=false")


def node_status(node: Any) -> dict[str, Any]:
    return json.loads(node.kubectl("get", "node", node.node_name, "-o", "json").stdout)["status"]


def gpu_resources(node: Any, promised: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) of the promised resources (a resource of an earlier plugin stays in capacity
    with allocatable 0 until the kubelet drops it)."""
    status = node_status(node)
    return ({k: status["capacity"].get(k) for k in promised}, {k: status["allocatable"].get(k) for k in promised})


def apply_pod(node: Any, namespace: str, name: str, gpus: int | None, env: dict[str, str] | None = None,
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


def printed(node: Any, namespace: str, name: str, timeout: float = 90) -> list[str]:
    """What the pod's container printed before its END line (waits for it)."""
    def logs() -> list[str] | None:
        out = node.kubectl("logs", "-n", namespace, name, check=False)
        return out.stdout.splitlines() if out.returncode == 0 and "END" in out.stdout else None
    lines = wait_for(logs, f"{name}'s output", timeout)
    return lines[:lines.index("END")]


def seen(node: Any, namespace: str, name: str) -> tuple[str, list[str]]:
    """(NVIDIA_VISIBLE_DEVICES, the entries under /var/run/nvidia-container-devices) inside the container."""
    lines = printed(node, namespace, name)
    return lines[0].removeprefix("NVD="), lines[1:]
