"""What only the stand-in device plugin (tests/e2e/deviceplugin) can show, against a kubelet's side of the API
in-process: real gRPC over unix sockets, the chart rendered with real helm. Everything the real
nvidia-device-plugin v0.20.0 can show on NVIDIA's mock NVML is asked of both in test_plugin_contract.py; here
are the MIG resources (the mock creates no MIG devices) and the MPS answer (the real plugin first asks its MPS
daemon at the fixed path /mps). Health is the real plugin's (test_real_plugin_health.py). The facts are listed,
with their upstream lines, in tests/e2e/deviceplugin/model.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpu_stack_dev.chartlib import ROOT, render
from gpu_stack_dev.e2e.fleet import ChartSharing, NodeSpec, plan

from tests.e2e.deviceplugin import stubs
from tests.e2e.deviceplugin.model import NodePlugin, mps_root_of, node_plugin
from tests.e2e.deviceplugin.server import StandInPlugin

from .kubelet_fake import FakeKubelet, Watch
from .kubelet_fake import advertised as kubelet_advertised

# Nodes per overlay: (overlay, GPU model, GPUs, expected {resource: count}), the counts as the chart's
# overlays promise them (10 MPS clients per GPU, MIG layouts of an A100 40GB).
NODES = [
    ("mps-x10.yaml", "Tesla-T4", 1, {"nvidia.com/gpu": 10}),
    ("mig-single-all-1g.yaml", "NVIDIA-A100-SXM4-40GB", 1, {"nvidia.com/gpu": 7}),
    ("mig-mixed-all-balanced.yaml", "NVIDIA-A100-SXM4-40GB", 1,
     {"nvidia.com/mig-1g.5gb": 2, "nvidia.com/mig-2g.10gb": 1, "nvidia.com/mig-3g.20gb": 1}),
]


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A short directory: a unix socket path must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gsdp-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _plugin(overlay: str, model: str = "Tesla-T4", gpus: int = 2, set_json: dict[str, Any] | None = None,
            config: str | None = None) -> NodePlugin:
    objects = render(4, overlay, set_json).objects()
    return node_plugin(NodeSpec("node1", gpus=gpus, model=model, config=config), ChartSharing.from_objects(objects),
                       mps_root=mps_root_of(objects))


def _allocate(kubelet: FakeKubelet, resource: str, *containers: list[str]) -> Any:
    pb, _ = stubs.load()
    endpoint = kubelet.registered(1)[resource].endpoint
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in containers])
    return kubelet.client(endpoint).Allocate(request, timeout=5)


def test_stubs_come_from_the_upstream_proto(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pb, _ = stubs.load()
    assert pb.DESCRIPTOR.package == "v1beta1"
    assert set(pb.DESCRIPTOR.services_by_name) == {"Registration", "DevicePlugin"}
    assert set(pb.DESCRIPTOR.services_by_name["DevicePlugin"].methods_by_name) == {
        "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate", "PreStartContainer"}
    edited = tmp_path / "api.proto"
    edited.write_text(stubs.PROTO.read_text(encoding="utf-8") + "\n// edited\n", encoding="utf-8")
    monkeypatch.setattr(stubs, "PROTO", edited)
    stubs.load.cache_clear()
    try:
        with pytest.raises(stubs.StubError, match="differs from the upstream file"):
            stubs.load()
    finally:
        stubs.load.cache_clear()


@pytest.mark.parametrize(("overlay", "model", "gpus", "expected"), NODES)
def test_registers_what_the_fleet_publishes(plugin_dir: Path, overlay: str, model: str, gpus: int,
                                            expected: dict[str, int]) -> None:
    objects = render(4, overlay).objects()
    sharing = ChartSharing.from_objects(objects)
    spec = NodeSpec("node1", gpus=gpus, model=model)
    plugin = node_plugin(spec, sharing, mps_root=mps_root_of(objects))
    with FakeKubelet(plugin_dir) as kubelet, StandInPlugin(plugin, plugin_dir):
        advertised = kubelet_advertised(kubelet, len(expected))
    assert advertised == expected
    fleet = {k: int(v) for k, v in plan(spec, sharing).resources.items() if k.startswith("nvidia.com/")}
    assert advertised == fleet


def test_allocate_mps_adds_the_daemon_pipe_and_shm(plugin_dir: Path) -> None:
    plugin = _plugin("mps-x10.yaml", gpus=1)
    replica = plugin.resources[0].devices[3].id
    with FakeKubelet(plugin_dir) as kubelet, StandInPlugin(plugin, plugin_dir):
        (answer,) = _allocate(kubelet, "nvidia.com/gpu", [replica]).container_responses
    assert answer.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
    assert [(m.container_path, m.host_path) for m in answer.mounts][:2] == [
        ("/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe"), ("/dev/shm", "/run/nvidia/mps/shm")]


def test_the_process_registers_and_serves_until_terminated(plugin_dir: Path, tmp_path: Path) -> None:
    """`python -m tests.e2e.deviceplugin`, the form an e2e node runs: a MIG node's devices, all Healthy."""
    rendered = tmp_path / "render.yaml"
    rendered.write_text(render(4, "mig-single-all-1g.yaml").stdout, encoding="utf-8")
    with FakeKubelet(plugin_dir) as kubelet:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.deviceplugin", "--render", str(rendered), "--node", "node1",
             "--gpus", "1", "--model", "NVIDIA-A100-SXM4-40GB", "--plugin-dir", str(plugin_dir)],
            cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            devices = json.loads(proc.stdout.readline())["nvidia.com/gpu"]
            assert len(devices) == 7
            request = kubelet.registered(1)["nvidia.com/gpu"]
            watch = Watch(kubelet.client(request.endpoint))
            assert watch.next() == dict.fromkeys(devices, "Healthy")
            watch.cancel()
        finally:
            proc.terminate()
            assert proc.wait(timeout=10) == 0
    assert not (plugin_dir / request.endpoint).exists()
