"""The kubelet's side of the device plugin API, in-process over real gRPC on unix sockets: a Registration
server on `<dir>/kubelet.sock` that records each RegisterRequest, and a client of the plugin's endpoint the
way the kubelet's device manager uses it (GetDevicePluginOptions, a ListAndWatch stream, Allocate,
GetPreferredAllocation)."""

from __future__ import annotations

import queue
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from tests.e2e.deviceplugin import stubs


class FakeKubelet:
    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.registrations: queue.Queue[Any] = queue.Queue()
        self._server: grpc.Server | None = None
        self._channels: list[grpc.Channel] = []

    def Register(self, request: Any, context: grpc.ServicerContext) -> Any:
        pb, _ = stubs.load()
        self.registrations.put(request)
        return pb.Empty()

    def __enter__(self) -> FakeKubelet:
        _, grpc_mod = stubs.load()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        grpc_mod.add_RegistrationServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.plugin_dir / 'kubelet.sock'}")
        self._server.start()
        return self

    def stop(self) -> None:
        for channel in self._channels:
            channel.close()
        self._channels.clear()
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def registered(self, count: int, timeout: float = 10) -> dict[str, Any]:
        """The next `count` registrations, by resource name."""
        out = {}
        for _ in range(count):
            request = self.registrations.get(timeout=timeout)
            out[request.resource_name] = request
        return out

    def client(self, endpoint: str) -> Any:
        """A DevicePlugin client of the socket a registration named (its base name, in the plugin dir)."""
        _, grpc_mod = stubs.load()
        channel = grpc.insecure_channel(f"unix://{self.plugin_dir / endpoint}")
        self._channels.append(channel)
        return grpc_mod.DevicePluginStub(channel)


class Watch:
    """A ListAndWatch stream read on a thread: `next()` is the next device list, {ID: health}."""

    def __init__(self, client: Any) -> None:
        pb, _ = stubs.load()
        self._stream = client.ListAndWatch(pb.Empty())
        self._lists: queue.Queue[dict[str, str]] = queue.Queue()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for response in self._stream:
                self._lists.put({d.ID: d.health for d in response.devices})
        except grpc.RpcError:
            pass

    def next(self, timeout: float = 10) -> dict[str, str]:
        return self._lists.get(timeout=timeout)

    def cancel(self) -> None:
        self._stream.cancel()


def advertised(kubelet: FakeKubelet, resources: int, timeout: float = 30) -> dict[str, int]:
    """{resource: devices} of the next `resources` registrations, each checked as NVIDIA/k8s-device-plugin v0.20.0
    registers (internal/plugin/server.go Register: version v1beta1, the socket nvidia-<name>.sock, preferred
    allocation on, no PreStartContainer) and its first ListAndWatch list all Healthy."""
    pb, _ = stubs.load()
    out = {}
    for name, request in kubelet.registered(resources, timeout=timeout).items():
        assert request.version == "v1beta1"
        assert request.endpoint == f"nvidia-{name.split('/', 1)[1]}.sock"
        assert request.options.get_preferred_allocation_available
        client = kubelet.client(request.endpoint)
        options = client.GetDevicePluginOptions(pb.Empty(), timeout=5)
        assert options.get_preferred_allocation_available and not options.pre_start_required
        watch = Watch(client)
        devices = watch.next(timeout=timeout)
        watch.cancel()
        assert set(devices.values()) == {"Healthy"}
        out[name] = len(devices)
    return out
