"""The stand-in device plugin (tests/e2e/deviceplugin) against a kubelet's side of the API in-process: real
gRPC over unix sockets, the chart rendered with real helm. What it registers must be what the fleet
publishes for the same overlay, and its Allocate answers what NVIDIA/k8s-device-plugin v0.20.0 answers
(internal/plugin/server.go getAllocateResponse; the facts are listed in tests/e2e/deviceplugin/model.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from gpu_stack_dev.chartlib import ROOT, render
from gpu_stack_dev.e2e.fleet import ChartSharing, NodeSpec, plan

from tests.e2e.deviceplugin import stubs
from tests.e2e.deviceplugin.model import NodePlugin, mps_root_of, node_plugin
from tests.e2e.deviceplugin.server import StandInPlugin, write_health

from .kubelet_fake import FakeKubelet, Watch

MOUNT_ROOT = "/var/run/nvidia-container-devices"
# Nodes per overlay: (overlay, GPU model, GPUs, expected {resource: count}), the counts as the chart's
# overlays promise them (4 replicas per T4, 10 MPS clients per GPU, MIG layouts of an A100 40GB).
NODES = [
    ("default", "Tesla-T4", 2, {"nvidia.com/gpu": 2}),
    ("exclusive.yaml", "Tesla-T4", 2, {"nvidia.com/gpu": 2}),
    ("time-slicing-t4-x4.yaml", "Tesla-T4", 2, {"nvidia.com/gpu": 8}),
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
        registered = kubelet.registered(len(expected))
        assert set(registered) == set(expected)
        advertised = {}
        for name, request in registered.items():
            assert request.version == "v1beta1"
            assert request.endpoint == f"nvidia-{name.split('/', 1)[1]}.sock"
            assert request.options.get_preferred_allocation_available
            client = kubelet.client(request.endpoint)
            options = client.GetDevicePluginOptions(stubs.load()[0].Empty(), timeout=5)
            assert options.get_preferred_allocation_available and not options.pre_start_required
            watch = Watch(client)
            devices = watch.next()
            watch.cancel()
            assert set(devices.values()) == {"Healthy"}
            advertised[name] = len(devices)
    assert advertised == expected
    fleet = {k: int(v) for k, v in plan(spec, sharing).resources.items() if k.startswith("nvidia.com/")}
    assert advertised == fleet


def test_time_slicing_replicas_are_named_as_upstream(plugin_dir: Path) -> None:
    plugin = _plugin("time-slicing-t4-x4.yaml", gpus=2)
    with FakeKubelet(plugin_dir) as kubelet, StandInPlugin(plugin, plugin_dir):
        watch = Watch(kubelet.client(kubelet.registered(1)["nvidia.com/gpu"].endpoint))
        ids = sorted(watch.next())
        watch.cancel()
    gpus = sorted({i.split("::")[0] for i in ids})
    assert len(gpus) == 2 and all(g.startswith("GPU-") for g in gpus)
    assert ids == sorted(f"{g}::{n}" for g in gpus for n in range(4))


def test_rename_by_default_advertises_the_shared_name(plugin_dir: Path) -> None:
    configs = {"ts": {"timeSlicing": {"renameByDefault": True,
                                      "resources": [{"name": "nvidia.com/gpu", "replicas": 3}]}}}
    plugin = _plugin("default", set_json={"sharing.configs": configs, "sharing.defaultConfig": "ts"})
    with FakeKubelet(plugin_dir) as kubelet, StandInPlugin(plugin, plugin_dir):
        registered = kubelet.registered(1)
    assert list(registered) == ["nvidia.com/gpu.shared"]
    assert registered["nvidia.com/gpu.shared"].endpoint == "nvidia-gpu.shared.sock"


def test_allocate_volume_mounts_as_upstream(plugin_dir: Path) -> None:
    plugin = _plugin("default")
    a, b = (d.id for d in plugin.resources[0].devices)
    with FakeKubelet(plugin_dir) as kubelet, StandInPlugin(plugin, plugin_dir):
        response = _allocate(kubelet, "nvidia.com/gpu", [a, b], [b])
    first, second = response.container_responses
    assert dict(first.envs) == {"NVIDIA_VISIBLE_DEVICES": MOUNT_ROOT}
    assert [(m.container_path, m.host_path) for m in first.mounts] == [
        (f"{MOUNT_ROOT}/{a}", "/dev/null"), (f"{MOUNT_ROOT}/{b}", "/dev/null")]
    assert [m.container_path for m in second.mounts] == [f"{MOUNT_ROOT}/{b}"]
    # passDeviceSpecs (the chart's default): each GPU's node; the control nodes only where they exist.
    assert [(d.container_path, d.host_path, d.permissions) for d in second.devices] == [
        (p, p, "rw") for p in ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
        if Path(p).exists()] + [("/dev/nvidia1", "/dev/nvidia1", "rw")]
    assert not first.annotations and not first.cdi_devices


def test_allocate_envvar_hands_the_ids_in_the_env(plugin_dir: Path) -> None:
    plugin = _plugin("time-slicing-t4-x4.yaml", set_json={
        "devicePlugin.deviceListStrategy": ["envvar"], "toolkit.acceptEnvvarUnprivileged": True})
    replica = plugin.resources[0].devices[5].id
    with FakeKubelet(plugin_dir) as kubelet, StandInPlugin(plugin, plugin_dir):
        (answer,) = _allocate(kubelet, "nvidia.com/gpu", [replica]).container_responses
    assert dict(answer.envs) == {"NVIDIA_VISIBLE_DEVICES": replica.split("::")[0]}
    assert list(answer.mounts) == []


def test_allocate_cdi_annotations_only(plugin_dir: Path) -> None:
    plugin = _plugin("default", set_json={"devicePlugin.deviceListStrategy": ["cdi-annotations"],
                                          "toolkit.cdi.enabled": True})
    gpu = plugin.resources[0].devices[0].id
    with FakeKubelet(plugin_dir) as kubelet, StandInPlugin(plugin, plugin_dir):
        (answer,) = _allocate(kubelet, "nvidia.com/gpu", [gpu]).container_responses
    ((key, value),) = answer.annotations.items()
    assert key.startswith("cdi.k8s.io/nvidia-device-plugin_") and value == f"nvidia.com/gpu={gpu}"
    assert dict(answer.envs) == {} and list(answer.mounts) == [] and list(answer.devices) == []


def test_allocate_mps_adds_the_daemon_pipe_and_shm(plugin_dir: Path) -> None:
    plugin = _plugin("mps-x10.yaml", gpus=1)
    replica = plugin.resources[0].devices[3].id
    with FakeKubelet(plugin_dir) as kubelet, StandInPlugin(plugin, plugin_dir):
        (answer,) = _allocate(kubelet, "nvidia.com/gpu", [replica]).container_responses
    assert answer.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
    assert [(m.container_path, m.host_path) for m in answer.mounts][:2] == [
        ("/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe"), ("/dev/shm", "/run/nvidia/mps/shm")]


def test_allocate_refuses_two_replicas_with_fail_requests_greater_than_one(plugin_dir: Path) -> None:
    plugin = _plugin("time-slicing-t4-x4.yaml")
    two = [d.id for d in plugin.resources[0].devices[:2]]
    with FakeKubelet(plugin_dir) as kubelet, StandInPlugin(plugin, plugin_dir), \
            pytest.raises(grpc.RpcError) as caught:
            _allocate(kubelet, "nvidia.com/gpu", two)
    assert "maximum request size for shared resources is 1; found 2" in caught.value.details()


def test_allocate_refuses_an_unknown_device(plugin_dir: Path) -> None:
    plugin = _plugin("default")
    with FakeKubelet(plugin_dir) as kubelet, StandInPlugin(plugin, plugin_dir), \
            pytest.raises(grpc.RpcError) as caught:
            _allocate(kubelet, "nvidia.com/gpu", ["GPU-nope"])
    assert "unknown device: GPU-nope" in caught.value.details()


def test_preferred_allocation_spreads_replicas_over_gpus(plugin_dir: Path) -> None:
    pb, _ = stubs.load()
    plugin = _plugin("time-slicing-t4-x4.yaml", gpus=2)
    ids = [d.id for d in plugin.resources[0].devices]
    with FakeKubelet(plugin_dir) as kubelet, StandInPlugin(plugin, plugin_dir):
        client = kubelet.client(kubelet.registered(1)["nvidia.com/gpu"].endpoint)
        # GPU 0 has two replicas in use (not available): the next two come from GPU 1 first, then alternate.
        available = [i for i in ids if i not in ids[:2]]
        response = client.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=3)]), timeout=5)
    (chosen,) = response.container_responses
    gpus = [i.split("::")[0] for i in chosen.deviceIDs]
    gpu0, gpu1 = ids[0].split("::")[0], ids[4].split("::")[0]
    assert gpus.count(gpu1) == 2 and gpus.count(gpu0) == 1 and gpus[0] == gpu1


def test_unhealthy_and_back_on_the_watch_stream(plugin_dir: Path) -> None:
    plugin = _plugin("default")
    a, b = (d.id for d in plugin.resources[0].devices)
    with FakeKubelet(plugin_dir) as kubelet, StandInPlugin(plugin, plugin_dir) as standin:
        watch = Watch(kubelet.client(kubelet.registered(1)["nvidia.com/gpu"].endpoint))
        assert watch.next() == {a: "Healthy", b: "Healthy"}
        assert standin.xid(plugin.resources[0].devices[1].gpu_uuid) == [("nvidia.com/gpu", b)]
        assert watch.next() == {a: "Healthy", b: "Unhealthy"}
        standin.set_health("nvidia.com/gpu", b, healthy=True)
        assert watch.next() == {a: "Healthy", b: "Healthy"}
        watch.cancel()


def test_an_xid_on_a_shared_gpu_marks_one_replica(plugin_dir: Path) -> None:
    """health.go keeps one device per GPU UUID, so one replica of a time-sliced GPU turns Unhealthy."""
    plugin = _plugin("time-slicing-t4-x4.yaml", gpus=1)
    with FakeKubelet(plugin_dir) as kubelet, StandInPlugin(plugin, plugin_dir) as standin:
        watch = Watch(kubelet.client(kubelet.registered(1)["nvidia.com/gpu"].endpoint))
        watch.next()
        standin.xid(plugin.gpu_uuids()[0])
        health = watch.next()
        watch.cancel()
    assert sorted(health.values()) == ["Healthy"] * 3 + ["Unhealthy"]


def test_the_process_registers_and_follows_its_health_file(plugin_dir: Path, tmp_path: Path) -> None:
    """`python -m tests.e2e.deviceplugin`, the form an e2e node runs, driven through its health file."""
    rendered = tmp_path / "render.yaml"
    rendered.write_text(render(4, "time-slicing-t4-x4.yaml").stdout, encoding="utf-8")
    health = plugin_dir / "health.json"
    with FakeKubelet(plugin_dir) as kubelet:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.deviceplugin", "--render", str(rendered), "--node", "node1",
             "--gpus", "1", "--plugin-dir", str(plugin_dir), "--health-file", str(health)],
            cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            devices = json.loads(proc.stdout.readline())["nvidia.com/gpu"]
            request = kubelet.registered(1)["nvidia.com/gpu"]
            watch = Watch(kubelet.client(request.endpoint))
            assert watch.next() == dict.fromkeys(devices, "Healthy")
            write_health(health, [devices[2]])
            assert watch.next() == {**dict.fromkeys(devices, "Healthy"), devices[2]: "Unhealthy"}
            write_health(health, [])
            assert watch.next() == dict.fromkeys(devices, "Healthy")
            watch.cancel()
        finally:
            proc.terminate()
            assert proc.wait(timeout=10) == 0
    assert not (plugin_dir / request.endpoint).exists()



def test_registers_again_with_a_restarted_kubelet(plugin_dir: Path) -> None:
    """A restarted kubelet makes a new kubelet.sock and removes the plugins' sockets: the stand-in serves and
    registers again (as upstream's cmd/nvidia-device-plugin/main.go on the socket's Create event)."""
    plugin = _plugin("default")
    with FakeKubelet(plugin_dir) as first, StandInPlugin(plugin, plugin_dir):
        assert list(first.registered(1)) == ["nvidia.com/gpu"]
        first.stop()
        for socket in plugin_dir.glob("*.sock"):
            socket.unlink()
        with FakeKubelet(plugin_dir) as second:
            request = second.registered(1, timeout=60)["nvidia.com/gpu"]
            watch = Watch(second.client(request.endpoint))
            assert len(watch.next()) == 2
            watch.cancel()
