"""One set of requests, two plugins: each test runs against the stand-in device plugin (tests/e2e/deviceplugin)
and against the real nvidia-device-plugin v0.20.0 on NVIDIA's mock NVML (real_plugin.py), both registered with
the in-process kubelet of kubelet_fake.py, real gRPC over unix sockets, the chart rendered with real helm. The
expectations are the upstream facts written out, so a stand-in answer that parts from the binary's fails here,
and so does a fleet count (gpu_stack_dev.e2e.fleet) that is not what the binary advertises.

What only the stand-in can show (test_standin.py): MIG devices (the mock creates none) and the MPS answer (the
real plugin first asks its MPS daemon, which it looks for at the fixed container path /mps). A device turning
Unhealthy is the real plugin's alone (test_real_plugin_health.py: the mock delivers an injected Xid)."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from gpu_stack_dev.chartlib import render
from gpu_stack_dev.e2e import mock_gpu
from gpu_stack_dev.e2e.fleet import ChartSharing, NodeSpec, plan

from tests.e2e.deviceplugin import stubs
from tests.e2e.deviceplugin.model import mps_root_of, node_plugin
from tests.e2e.deviceplugin.server import StandInPlugin
from tests.gpu_node import unpacked_or_skip
from tests.require import skip_or_fail

from .kubelet_fake import FakeKubelet, Watch
from .kubelet_fake import advertised as kubelet_advertised
from .real_plugin import RealPlugin, RealPluginUnavailable

STAND_IN, REAL = "stand-in", "nvidia-device-plugin-v0.20.0"
MOUNT_ROOT = "/var/run/nvidia-container-devices"
# the fleet's GPU model for each mock profile (the fleet knows real products; the mock's only differ in name)
FLEET_MODEL = {"t4": "Tesla-T4", "a100": "NVIDIA-A100-SXM4-40GB"}
# (overlay, device plugin config or None for the chart's default, profile, GPUs, {resource: count})
NODES = [
    ("default", None, "t4", 2, {"nvidia.com/gpu": 2}),
    ("exclusive.yaml", None, "a100", 3, {"nvidia.com/gpu": 3}),
    ("time-slicing-t4-x4.yaml", None, "t4", 2, {"nvidia.com/gpu": 8}),
    ("time-slicing-2080ti-x6.yaml", None, "t4", 1, {"nvidia.com/gpu": 6}),
    ("per-node-configs.yaml", "ts-x4", "t4", 2, {"nvidia.com/gpu": 8}),
    ("per-node-configs.yaml", "default", "t4", 2, {"nvidia.com/gpu": 2}),
]


@dataclass
class Running:
    kubelet: FakeKubelet
    dev_root: Path
    endpoints: dict[str, str] = field(default_factory=dict)

    def endpoint(self, resource: str = "nvidia.com/gpu") -> str:
        """The socket the plugin registered for `resource` (its first registration, read once)."""
        if resource not in self.endpoints:
            self.endpoints[resource] = str(self.kubelet.registered(1, timeout=30)[resource].endpoint)
        return self.endpoints[resource]

    def device_ids(self, resource: str = "nvidia.com/gpu") -> list[str]:
        watch = Watch(self.kubelet.client(self.endpoint(resource)))
        ids = sorted(watch.next(timeout=30))
        watch.cancel()
        return ids


Start = Callable[..., Running]


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A short directory: a unix socket path must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gsdp-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=[STAND_IN, REAL])
def start(request: pytest.FixtureRequest, plugin_dir: Path, tmp_path: Path) -> Iterator[Start]:
    """start(overlay, gpus=2, set_json=None, profile="t4", config=None): the plugin under test serving the node's
    config of that render, and the kubelet it registered with."""
    unpacked_or_skip()
    with ExitStack() as stack:
        def start_(overlay: str, gpus: int = 2, set_json: dict[str, Any] | None = None, profile: str = "t4",
                   config: str | None = None) -> Running:
            objects = render(4, overlay, set_json).objects()
            kubelet = stack.enter_context(FakeKubelet(plugin_dir))
            if request.param == REAL:
                try:
                    real = RealPlugin(objects, plugin_dir, tmp_path, profile=profile, gpus=gpus, config=config)
                except RealPluginUnavailable as exc:
                    skip_or_fail(str(exc))
                stack.enter_context(real)
                stack.callback(lambda: print(real.output()))  # the binary's log, when a test fails
                return Running(kubelet, real.dev_root)
            dev_root = tmp_path / "driver"
            (tmp_path / "profile.yaml").write_text(mock_gpu.trimmed_profile(profile, gpus))
            _, uuids, _ = mock_gpu.read_profile(tmp_path / "profile.yaml")
            spec = NodeSpec("node1", gpus=gpus, model=FLEET_MODEL[profile], config=config)
            plugin = node_plugin(spec, ChartSharing.from_objects(objects), mps_root=mps_root_of(objects),
                                 gpu_uuids=uuids)
            stack.enter_context(StandInPlugin(dataclasses.replace(plugin, dev_root=str(dev_root)), plugin_dir))
            return Running(kubelet, dev_root)
        yield start_


def _allocate(running: Running, *containers: list[str], resource: str = "nvidia.com/gpu") -> Any:
    pb, _ = stubs.load()
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in containers])
    return running.kubelet.client(running.endpoint(resource)).Allocate(request, timeout=10)


@pytest.mark.parametrize(("overlay", "config", "profile", "gpus", "expected"), NODES)
def test_registers_what_the_chart_and_the_fleet_promise(start: Start, overlay: str, config: str | None,
                                                        profile: str, gpus: int, expected: dict[str, int]) -> None:
    running = start(overlay, gpus=gpus, profile=profile, config=config)
    advertised = kubelet_advertised(running.kubelet, len(expected))
    assert advertised == expected
    sharing = ChartSharing.from_objects(render(4, overlay).objects())
    fleet = plan(NodeSpec("node1", gpus=gpus, model=FLEET_MODEL[profile], config=config), sharing).resources
    assert advertised == {k: int(v) for k, v in fleet.items() if k.startswith("nvidia.com/")}


def test_time_slicing_replicas_are_named_as_upstream(start: Start) -> None:
    ids = start("time-slicing-t4-x4.yaml", gpus=2).device_ids()
    gpus = sorted({i.split("::")[0] for i in ids})
    assert gpus == ["GPU-00000074-0000-0000-0000-000000000000", "GPU-00000074-0000-0000-0000-000000000001"]
    assert ids == sorted(f"{g}::{n}" for g in gpus for n in range(4))


def test_rename_by_default_advertises_the_shared_name(start: Start) -> None:
    configs = {"ts": {"timeSlicing": {"renameByDefault": True,
                                      "resources": [{"name": "nvidia.com/gpu", "replicas": 3}]}}}
    running = start("default", set_json={"sharing.configs": configs, "sharing.defaultConfig": "ts"})
    registered = running.kubelet.registered(1, timeout=30)
    assert list(registered) == ["nvidia.com/gpu.shared"]
    assert registered["nvidia.com/gpu.shared"].endpoint == "nvidia-gpu.shared.sock"


def test_allocate_volume_mounts_as_upstream(start: Start) -> None:
    running = start("default")
    a, b = running.device_ids()
    first, second = _allocate(running, [a, b], [b]).container_responses
    assert dict(first.envs) == {"NVIDIA_VISIBLE_DEVICES": MOUNT_ROOT}
    assert [(m.container_path, m.host_path) for m in first.mounts] == [
        (f"{MOUNT_ROOT}/{a}", "/dev/null"), (f"{MOUNT_ROOT}/{b}", "/dev/null")]
    assert [m.container_path for m in second.mounts] == [f"{MOUNT_ROOT}/{b}"]
    # passDeviceSpecs (the chart's default): each GPU's node under the dev root; the control nodes only where
    # they exist where the plugin runs (server.go apiDeviceSpecs stats the container path).
    control = [p for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
               if Path(p).exists()]
    assert [(d.container_path, d.host_path, d.permissions) for d in second.devices] == [
        (p, f"{running.dev_root}{p}", "rw") for p in [*control, "/dev/nvidia1"]]
    assert not first.annotations and not first.cdi_devices


def test_allocate_envvar_hands_the_ids_in_the_env(start: Start) -> None:
    running = start("time-slicing-t4-x4.yaml", set_json={
        "devicePlugin.deviceListStrategy": ["envvar"], "toolkit.acceptEnvvarUnprivileged": True})
    replica = running.device_ids()[5]
    (answer,) = _allocate(running, [replica]).container_responses
    assert dict(answer.envs) == {"NVIDIA_VISIBLE_DEVICES": replica.split("::")[0]}
    assert list(answer.mounts) == []


def test_allocate_cdi_annotations_only(start: Start) -> None:
    running = start("default", set_json={"devicePlugin.deviceListStrategy": ["cdi-annotations"],
                                         "toolkit.cdi.enabled": True})
    gpu = running.device_ids()[0]
    (answer,) = _allocate(running, [gpu]).container_responses
    ((key, value),) = answer.annotations.items()
    assert key.startswith("cdi.k8s.io/nvidia-device-plugin_") and value == f"k8s.device-plugin.nvidia.com/gpu={gpu}"
    assert dict(answer.envs) == {} and list(answer.mounts) == [] and list(answer.devices) == []


def test_allocate_cdi_cri_names_the_devices(start: Start) -> None:
    running = start("default", set_json={"devicePlugin.deviceListStrategy": ["cdi-cri"], "toolkit.cdi.enabled": True})
    a, b = running.device_ids()
    (answer,) = _allocate(running, [a, b]).container_responses
    assert [d.name for d in answer.cdi_devices] == [f"k8s.device-plugin.nvidia.com/gpu={i}" for i in (a, b)]
    assert dict(answer.envs) == {} and not answer.annotations and list(answer.devices) == []


def test_allocate_refuses_two_replicas_with_fail_requests_greater_than_one(start: Start) -> None:
    running = start("time-slicing-t4-x4.yaml")
    two = running.device_ids()[:2]
    with pytest.raises(grpc.RpcError) as caught:
        _allocate(running, two)
    assert "maximum request size for shared resources is 1; found 2" in caught.value.details()


def test_allocate_refuses_an_unknown_device(start: Start) -> None:
    running = start("default")
    running.device_ids()
    with pytest.raises(grpc.RpcError) as caught:
        _allocate(running, ["GPU-nope"])
    assert "unknown device: GPU-nope" in caught.value.details()


def test_preferred_allocation_spreads_replicas_over_gpus(start: Start) -> None:
    pb, _ = stubs.load()
    running = start("time-slicing-t4-x4.yaml", gpus=2)
    ids = running.device_ids()
    client = running.kubelet.client(running.endpoint())
    # GPU 0 has two replicas in use (not available): the next two come from GPU 1 first, then alternate.
    available = [i for i in ids if i not in ids[:2]]
    response = client.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=3)]), timeout=10)
    (chosen,) = response.container_responses
    gpus = [i.split("::")[0] for i in chosen.deviceIDs]
    gpu0, gpu1 = ids[0].split("::")[0], ids[4].split("::")[0]
    assert gpus.count(gpu1) == 2 and gpus.count(gpu0) == 1 and gpus[0] == gpu1


def test_registers_again_with_a_restarted_kubelet(start: Start, plugin_dir: Path) -> None:
    """A restarted kubelet makes a new kubelet.sock and removes the plugins' sockets: the plugin serves and
    registers again (cmd/nvidia-device-plugin/main.go, on the socket's fsnotify Create event)."""
    running = start("default")
    assert len(running.device_ids()) == 2
    running.kubelet.stop()
    for socket in plugin_dir.glob("*.sock"):
        socket.unlink()
    with FakeKubelet(plugin_dir) as second:
        request = second.registered(1, timeout=60)["nvidia.com/gpu"]
        watch = Watch(second.client(request.endpoint))
        assert len(watch.next(timeout=30)) == 2
        watch.cancel()
