"""The real nvidia-device-plugin v0.20.0's health check on NVIDIA's mock NVML with a GPU failing: the mock's
failure injection (gpu_stack_dev.e2e.mock_gpu.inject_failure) delivers the Xid through the NVML event set, the
plugin's health check (internal/rm/health.go checkHealth, v0.20.0) waits on it, and the kubelet's side of the API
(kubelet_fake.py) sees the device turn Unhealthy on the ListAndWatch stream. The plugin runs with
hack/node/mock-nvml-clock.c preloaded: without it the mock never trips the failure in the NVML session the
health check waits in (the file says why). The node-level outcome (allocatable, inspect, the alert) is
tests/e2e/node/test_agents_health.py.

Upstream, v0.20.0:
- health.go:133-141: only NVML_EVENT_TYPE_XID_CRITICAL_ERROR events count, and not the Xids it ignores
  (health.go:233-240: 13, 31, 43, 45, 68, 109, "application errors") nor those listed in DP_DISABLE_HEALTHCHECKS
  (comma-separated; `all` or `xids` turns the check off, health.go:45-48); DP_ENABLE_HEALTHCHECKS re-enables
  listed Xids. 79 is not ignored.
- health.go:169-170 sends the device on the plugin's health channel; server.go:276-279 (ListAndWatch) sets it
  Unhealthy and sends the list again. Nothing sets a device Healthy again ("FIXME: there is no way to recover
  from the Unhealthy state", server.go:277): a new plugin process builds every device Healthy
  (internal/rm/devices.go:92) and only a new Xid marks one again.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from gpu_stack_dev.chartlib import render
from gpu_stack_dev.e2e import mock_gpu

from tests.gpu_node import unpacked_or_skip
from tests.require import skip_or_fail

from .kubelet_fake import FakeKubelet, Watch
from .real_plugin import RealPlugin, RealPluginUnavailable


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A short directory: a unix socket path must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gsdh-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    """The chart's default render (one nvidia.com/gpu per GPU)."""
    return render(4, "default").objects()


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as s:
        yield s


def real_plugin(objects: list[dict[str, Any]], plugin_dir: Path, work: Path, stack: ExitStack,
                env: dict[str, str] | None = None) -> RealPlugin:
    """The binary on 2 mock T4s with the mock's clock preloaded, not started."""
    unpacked_or_skip()
    try:
        real = RealPlugin(objects, plugin_dir, work, gpus=2, env=env)
        real.extra_env["LD_PRELOAD"] = str(mock_gpu.clock_library(real.dev_root))
    except (RealPluginUnavailable, FileNotFoundError) as exc:
        skip_or_fail(str(exc))
    stack.callback(real.stop)
    stack.callback(lambda: print(real.output()))  # the binary's log, when a test fails
    return real


def watch(kubelet: FakeKubelet, stack: ExitStack) -> Watch:
    """A ListAndWatch stream of the plugin's next registration."""
    request = kubelet.registered(1, timeout=60)["nvidia.com/gpu"]
    stream = Watch(kubelet.client(request.endpoint))
    stack.callback(stream.cancel)
    return stream


@pytest.mark.parametrize(("overlay", "replicas"), [("default", 1), ("time-slicing-t4-x4.yaml", 4)])
def test_an_xid_79_turns_its_gpu_unhealthy_on_the_watch_stream(plugin_dir: Path, tmp_path: Path, stack: ExitStack,
                                                               overlay: str, replicas: int) -> None:
    """A GPU failing under a running plugin: the mock re-reads overrides.yaml every second. A time-sliced GPU's
    Xid marks one of its replicas: health.go:88 keeps one device per GPU UUID (the last of a Go map's iteration,
    so which one is not fixed)."""
    real = real_plugin(render(4, overlay).objects(), plugin_dir, tmp_path, stack)
    _, failing = real_uuids(real)
    kubelet = stack.enter_context(FakeKubelet(plugin_dir))
    real.start()
    stream = watch(kubelet, stack)
    first = stream.next(timeout=30)
    assert len(first) == 2 * replicas and set(first.values()) == {"Healthy"}
    mock_gpu.inject_failure(real.dev_root, 1, xid=79)  # the GPU fails while the plugin runs
    after = stream.next(timeout=60)
    (unhealthy,) = [device for device, health in after.items() if health == "Unhealthy"]
    assert set(after) == set(first) and unhealthy.split("::")[0] == failing
    log = real.output()
    assert f"XidCriticalError: Xid=79 on Device={unhealthy}; marking device as unhealthy." in log
    assert f"'nvidia.com/gpu' device marked unhealthy: {unhealthy}" in log


def test_a_restarted_plugin_advertises_the_gpu_healthy_once_it_no_longer_fails(
        objects: list[dict[str, Any]], plugin_dir: Path, tmp_path: Path, stack: ExitStack) -> None:
    """No recovery in the process (server.go:277); a new process starts every device Healthy (devices.go:92). On
    the mock a GPU that still fails trips again in the new process, so it turns Unhealthy again; repaired, it
    stays Healthy."""
    real = real_plugin(objects, plugin_dir, tmp_path, stack)
    healthy, failing = real_uuids(real)
    mock_gpu.inject_failure(real.dev_root, 1, xid=79)
    kubelet = stack.enter_context(FakeKubelet(plugin_dir))
    real.start()
    first = watch(kubelet, stack)
    first.next(timeout=30)
    assert first.next(timeout=60) == {healthy: "Healthy", failing: "Unhealthy"}
    first.cancel()

    real.stop()  # restarted with the GPU still failing: Unhealthy again
    real.start()
    again = watch(kubelet, stack)
    assert again.next(timeout=30) == {healthy: "Healthy", failing: "Healthy"}
    assert again.next(timeout=60) == {healthy: "Healthy", failing: "Unhealthy"}
    again.cancel()

    real.stop()  # the GPU repaired, then the plugin restarted: Healthy, and its health check watches it again
    mock_gpu.clear_failures(real.dev_root)
    real.start()
    repaired = watch(kubelet, stack)
    assert repaired.next(timeout=30) == {healthy: "Healthy", failing: "Healthy"}
    assert wait_for_line(real, "Ignoring the following XIDs for health checks")
    assert "marking device as unhealthy" not in real.output()


@pytest.mark.parametrize(("xid", "env"), [
    pytest.param(13, {}, id="xid-13-an-application-error-upstream-ignores"),
    pytest.param(79, {"DP_DISABLE_HEALTHCHECKS": "79"}, id="xid-79-listed-in-DP_DISABLE_HEALTHCHECKS"),
])
def test_an_ignored_xid_is_skipped_and_the_gpu_stays_healthy(objects: list[dict[str, Any]], plugin_dir: Path,
                                                            tmp_path: Path, stack: ExitStack, xid: int,
                                                            env: dict[str, str]) -> None:
    real = real_plugin(objects, plugin_dir, tmp_path, stack, env=env)
    healthy, failing = real_uuids(real)
    mock_gpu.inject_failure(real.dev_root, 1, xid=xid)
    kubelet = stack.enter_context(FakeKubelet(plugin_dir))
    real.start()
    stream = watch(kubelet, stack)
    assert stream.next(timeout=30) == {healthy: "Healthy", failing: "Healthy"}
    # the event was delivered and skipped (health.go:138-140 logs it as a struct: EventData is the Xid)
    skipped = wait_for_line(real, "Skipping event")
    assert f"EventData:{xid} " in skipped
    stream.cancel()
    # what a new ListAndWatch (the kubelet's, after a restart) is sent: the device still Healthy
    assert watch_again(kubelet, stack) == {healthy: "Healthy", failing: "Healthy"}
    assert "marking device as unhealthy" not in real.output()


def real_uuids(real: RealPlugin) -> tuple[str, str]:
    _, uuids, _ = mock_gpu.read_profile(real.dev_root / "config" / "config.yaml")
    first, second = uuids
    return first, second


def watch_again(kubelet: FakeKubelet, stack: ExitStack) -> dict[str, str]:
    """The first list of a new ListAndWatch of the running plugin."""
    stream = Watch(kubelet.client("nvidia-gpu.sock"))
    stack.callback(stream.cancel)
    return stream.next(timeout=30)


def wait_for_line(real: RealPlugin, text: str, timeout: float = 60) -> str:
    """The first line of the plugin's log with `text` (waits for it)."""
    deadline = time.monotonic() + timeout
    while True:
        line = next((line for line in real.output().splitlines() if text in line), None)
        if line is not None:
            return line
        if time.monotonic() > deadline:
            raise AssertionError(f"no {text!r} in the plugin's log:\n{real.output()}")
        time.sleep(0.5)
