"""The real nvidia-device-plugin v0.20.0 (../shared/gpu-node, built from the chart's pinned tag) on NVIDIA's mock
NVML, registered with the in-process kubelet of kubelet_fake.py, so the stand-in's answers can be checked against
the binary's with the same requests.

The plugin serves on the fixed path /var/lib/kubelet/device-plugins/nvidia-<name>.sock (upstream's
pluginapi.DevicePluginPath, internal/plugin/server.go getPluginSocketPath, v0.20.0). It runs in a mount namespace
of its own where that directory is the test's plugin directory (`unshare -m`, a tmpfs on /var/lib): its sockets
and the fake kubelet's are the same files, and nothing on the machine's /var/lib is touched. The driver is a mock
driver root (mock_gpu.lay_out) with the profile's first `gpus` GPUs, with the plugin pointed at it as the
chart's values point a preinstalled driver: NVIDIA_DRIVER_ROOT and NVIDIA_DEV_ROOT (with passDeviceSpecs the
plugin hands <dev root>/dev/nvidiaN)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from gpu_stack_dev.e2e import mock_gpu
from gpu_stack_dev.e2e.fleet import ChartSharing

from tests.e2e.deviceplugin.model import mps_root_of

DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins"


class RealPluginUnavailable(RuntimeError):
    """The binary or the mount namespace it needs cannot be had here."""


def plugin_config(objects: list[dict[str, Any]], name: str | None = None) -> str:
    """The config file the chart's config-manager writes for the node, as the chart renders it: the ConfigMap
    entry `name`, else the DEFAULT_CONFIG the chart gives the config-manager (ChartSharing reads it)."""
    configmap = next(o for o in objects if o["kind"] == "ConfigMap"
                     and o["metadata"]["name"].endswith("-device-plugin-configs"))
    return str(configmap["data"][name if name is not None else ChartSharing.from_objects(objects).default_config])


class RealPlugin:
    """One run of the binary for a chart render; a context manager. `dev_root` is where its device nodes are (and
    the mock's profile, under config/: mock_gpu.inject_failure fails a GPU there); `env` is added to the
    binary's environment (e.g. DP_DISABLE_HEALTHCHECKS)."""

    def __init__(self, objects: list[dict[str, Any]], plugin_dir: Path, work: Path, *, profile: str = "t4",
                 gpus: int = 2, config: str | None = None, config_text: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        """`config`: the render's ConfigMap entry to run with (None: the chart's default); `config_text`: a config
        file's text instead (one the chart would have written had it let it through)."""
        try:
            files = mock_gpu.unpacked()
        except FileNotFoundError as exc:
            raise RealPluginUnavailable(str(exc)) from exc
        if shutil.which("unshare") is None or os.geteuid() != 0:
            raise RealPluginUnavailable("the real plugin's fixed socket path needs `unshare -m` as root")
        self.binary = files / "nvidia-device-plugin"
        self.dev_root = work / "driver"
        mock_gpu.lay_out(self.dev_root, profile, gpus)
        self.config = work / "plugin-config.yaml"
        self.config.write_text(config_text if config_text is not None else plugin_config(objects, config))
        self.log = work / "plugin.log"
        self.plugin_dir, self.mps_root = plugin_dir, mps_root_of(objects)
        self.extra_env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RealPlugin:
        root = str(self.dev_root)
        # /run too: with a CDI device list strategy the plugin writes its CDI spec to /var/run/cdi.
        script = (f"mount -t tmpfs tmpfs /var/lib && mount -t tmpfs tmpfs /run && mkdir -p {DEVICE_PLUGIN_PATH} && "
                  f'mount --bind "$0" {DEVICE_PLUGIN_PATH} && exec "$@"')
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NVIDIA_DRIVER_ROOT": root, "NVIDIA_DEV_ROOT": root,
               "MPS_ROOT": self.mps_root, **self.extra_env}
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                ["unshare", "-m", "sh", "-c", script, str(self.plugin_dir), str(self.binary),
                 f"--config-file={self.config}", f"--driver-root-ctr-path={root}"],
                env=env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def exists(self, path: str) -> bool:
        """Whether a device node the plugin may hand out exists under its dev root."""
        return (self.dev_root / path.lstrip("/")).exists()

    def wait(self, timeout: float) -> int:
        """The binary's exit status, once it exits (subprocess.TimeoutExpired while it still runs)."""
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> RealPlugin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
