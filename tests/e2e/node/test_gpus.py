"""What the real device plugin cannot show on the mock NVML, shown on a real kubelet with the stand-in device plugin
(tests/e2e/deviceplugin) registered with the node's device manager, pods run by containerd under gVisor: MIG
resources (the mock creates no MIG devices). A device turning Unhealthy is the real plugin's on the mock
(test_agents_health.py). The stand-in's answers are the real plugin's wherever both can answer
(tests/deviceplugin/test_plugin_contract.py); the rest of what a GPU node does is shown with the real agents
(test_agents_*.py).

Uses the `real_node` fixture (tests/e2e/node/conftest.py;
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
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gpu_stack_dev.e2e.e2elib import unique

from tests.require import skip_or_fail

from .standin import StandIn, apply_pod, gpu_resources, scratch_namespace, wait_for

# (overlay, GPU model, GPUs): measured on a kubelet v1.36.2 node, capacity == allocatable == the fleet's.
# Only the MIG overlays: the real device plugin shows the others' numbers (test_agents_*.py); NVIDIA's mock NVML
# creates no MIG devices, so for MIG the stand-in is what is left.
OVERLAYS = [
    ("mig-single-all-1g.yaml", "NVIDIA-A100-SXM4-40GB", 1),
    ("mig-mixed-all-balanced.yaml", "NVIDIA-A100-SXM4-40GB", 1),
]


@pytest.fixture
def node(request: pytest.FixtureRequest) -> Any:
    try:
        return request.getfixturevalue("real_node")
    except pytest.FixtureLookupError:
        skip_or_fail("needs the real_node fixture (a kubelet + containerd node)")


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
    with scratch_namespace(node, unique("gpus")) as name:
        yield name


@pytest.mark.parametrize(("overlay", "model", "gpus"), OVERLAYS)
def test_capacity_and_allocatable_are_what_the_chart_and_the_fleet_promise(
        node: Any, standin: Callable[..., StandIn], overlay: str, model: str, gpus: int) -> None:
    plugin = standin(overlay, model, gpus)
    promised = plugin.promised()
    assert promised == {r.name: str(len(r.devices)) for r in plugin.plugin.resources}
    wait_for(lambda: gpu_resources(node, promised) == (promised, promised), f"{promised} on {node.node_name}")


def test_an_unknown_runtime_class_handler_leaves_the_pod_in_container_creating(node: Any, namespace: str) -> None:
    """What a RuntimeClass whose handler the node's containerd lacks does to a pod: the sandbox is never made."""
    handler = f"gs-unknown-{uuid.uuid4().hex[:6]}"
    node.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": handler}, "handler": handler}))
    try:
        apply_pod(node, namespace, "rc", gpus=None, extra={"runtimeClassName": handler})

        def sandbox_failure() -> str | None:
            events = json.loads(node.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
            return next((e["message"] for e in events if e["reason"] == "FailedCreatePodSandBox"), None)
        message = wait_for(sandbox_failure, "FailedCreatePodSandBox")
        assert f'no runtime for "{handler}" is configured' in message
        pod = json.loads(node.kubectl("get", "pod", "-n", namespace, "rc", "-o", "json").stdout)
        assert pod["status"]["phase"] == "Pending" and pod["spec"]["nodeName"] == node.node_name
    finally:
        node.kubectl("delete", "runtimeclass", handler, "--wait=false")
