"""The stand-in device plugin's gRPC edge: one DevicePlugin server per resource on
`<plugin dir>/nvidia-<name>.sock`, registered with the kubelet's Registration service on
`<plugin dir>/kubelet.sock`, as NVIDIA/k8s-device-plugin v0.20.0 internal/plugin/server.go does (Serve,
Register with version v1beta1, the socket's base name, the resource name and
GetPreferredAllocationAvailable; GetDevicePluginOptions the same; PreStartContainer answers empty).

A new kubelet.sock (a restarted kubelet, which also removes the plugins' sockets) makes it serve and
register again, as upstream's cmd/nvidia-device-plugin/main.go does on the socket's fsnotify Create event
(here: a poll of the socket's inode).

Every device is Healthy: a device turning Unhealthy is the real plugin's, on NVIDIA's mock NVML with a GPU
failing (tests/deviceplugin/test_real_plugin_health.py, tests/e2e/node/test_agents_health.py).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from . import stubs
from .model import API_VERSION, HEALTHY, AllocateError, ContainerAllocation, NodePlugin

KUBELET_SOCKET = "kubelet.sock"  # deviceplugin/v1beta1 constants.go KubeletSocket (in DevicePluginPath)
KUBELET_POLL_SECONDS = 0.5


@dataclass(frozen=True)
class AllocateCall:
    resource: str
    device_ids: tuple[tuple[str, ...], ...]  # per container


class _Servicer:
    """DevicePluginServicer of one resource (methods as the generated base class names them)."""

    def __init__(self, owner: StandInPlugin, resource: str) -> None:
        self.owner, self.resource = owner, resource

    def GetDevicePluginOptions(self, request: Any, context: grpc.ServicerContext) -> Any:
        pb, _ = stubs.load()
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        """The device list once, then the stream stays open until the plugin stops (nothing changes)."""
        yield self.owner.list_response(self.resource)
        while not self.owner.stopped.wait(0.5) and context.is_active():
            pass

    def GetPreferredAllocation(self, request: Any, context: grpc.ServicerContext) -> Any:
        pb, _ = stubs.load()
        out = pb.PreferredAllocationResponse()
        try:
            for req in request.container_requests:
                ids = self.owner.plugin.preferred(self.resource, list(req.available_deviceIDs),
                                                  list(req.must_include_deviceIDs), req.allocation_size)
                out.container_responses.add(deviceIDs=ids)
        except AllocateError as exc:
            context.abort(grpc.StatusCode.UNKNOWN, str(exc))
        return out

    def Allocate(self, request: Any, context: grpc.ServicerContext) -> Any:
        pb, _ = stubs.load()
        ids = tuple(tuple(req.devices_ids) for req in request.container_requests)
        self.owner.record(AllocateCall(self.resource, ids))
        out = pb.AllocateResponse()
        try:
            for container_ids in ids:
                answer = self.owner.plugin.allocate(self.resource, container_ids, exists=os.path.exists)
                out.container_responses.append(_response(pb, answer))
        except AllocateError as exc:
            context.abort(grpc.StatusCode.UNKNOWN, str(exc))
        return out

    def PreStartContainer(self, request: Any, context: grpc.ServicerContext) -> Any:
        pb, _ = stubs.load()
        return pb.PreStartContainerResponse()


def _response(pb: Any, answer: ContainerAllocation) -> Any:
    return pb.ContainerAllocateResponse(
        envs=dict(answer.envs),
        mounts=[pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                for m in answer.mounts],
        devices=[pb.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
                 for d in answer.devices],
        annotations=dict(answer.annotations),
        cdi_devices=[pb.CDIDevice(name=n) for n in answer.cdi_devices])


class StandInPlugin:
    """Serves every resource of `plugin` in `plugin_dir` and registers them with the kubelet there."""

    def __init__(self, plugin: NodePlugin, plugin_dir: Path) -> None:
        self.plugin, self.plugin_dir = plugin, Path(plugin_dir)
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.calls: list[AllocateCall] = []
        self._servers: list[grpc.Server] = []
        self._watcher: threading.Thread | None = None

    def list_response(self, resource: str) -> Any:
        pb, _ = stubs.load()
        return pb.ListAndWatchResponse(devices=[
            pb.Device(ID=d.id, health=HEALTHY)
            for d in self.plugin.resource(resource).devices])

    def record(self, call: AllocateCall) -> None:
        with self.lock:
            self.calls.append(call)

    # -- lifecycle -----------------------------------------------------------------------------------
    def socket(self, resource: str) -> Path:
        return self.plugin_dir / self.plugin.resource(resource).socket_name

    def serve(self) -> None:
        self._serve_resources()

    def _serve_resources(self) -> None:
        _, grpc_mod = stubs.load()
        for res in self.plugin.resources:
            path = self.socket(res.name)
            path.unlink(missing_ok=True)
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
            grpc_mod.add_DevicePluginServicer_to_server(_Servicer(self, res.name), server)
            server.add_insecure_port(f"unix://{path}")
            server.start()
            self._servers.append(server)

    def register(self, timeout: float = 5.0) -> None:
        """Register every resource with the kubelet (Registration.Register on kubelet.sock)."""
        pb, grpc_mod = stubs.load()
        with grpc.insecure_channel(f"unix://{self.plugin_dir / KUBELET_SOCKET}") as channel:
            grpc.channel_ready_future(channel).result(timeout=timeout)
            client = grpc_mod.RegistrationStub(channel)
            for res in self.plugin.resources:
                client.Register(pb.RegisterRequest(
                    version=API_VERSION, endpoint=res.socket_name, resource_name=res.name,
                    options=pb.DevicePluginOptions(get_preferred_allocation_available=True)), timeout=timeout)

    def start(self) -> StandInPlugin:
        self.serve()
        try:
            self.register()
        except BaseException:
            self.stop()  # leave no socket behind in the kubelet's directory
            raise
        self._watcher = threading.Thread(target=self._follow_kubelet, name="kubelet-socket", daemon=True)
        self._watcher.start()
        return self

    def _kubelet_socket_id(self) -> tuple[int, int] | None:
        try:
            stat = (self.plugin_dir / KUBELET_SOCKET).stat()
        except OSError:
            return None
        return stat.st_ino, stat.st_ctime_ns  # an inode number alone may be reused by the new socket

    def _follow_kubelet(self) -> None:
        known = self._kubelet_socket_id()
        while not self.stopped.wait(KUBELET_POLL_SECONDS):
            current = self._kubelet_socket_id()
            if current is None or current == known:
                continue
            known = current
            try:
                for server in self._servers:
                    server.stop(grace=None).wait()
                self._servers.clear()
                self._serve_resources()
                self.register()
            except Exception as exc:  # the kubelet may not answer yet: retry on the next poll
                print(f"stand-in device plugin: registering again failed, retrying: {exc!r}", file=sys.stderr)
                known = None

    def stop(self) -> None:
        self.stopped.set()
        for server in self._servers:
            server.stop(grace=1).wait()
        for res in self.plugin.resources:
            self.socket(res.name).unlink(missing_ok=True)

    def __enter__(self) -> StandInPlugin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
