"""A sharing config the real device plugin would refuse fails the render with a gpu-stack: message, never a crash
loop on the nodes: the chart's check quotes the refusal of k8s-device-plugin v0.20.0 itself, run here on the
config file the chart would have written (../shared/gpu-node's binary, NVIDIA's mock NVML).

The binary runs as tests/deviceplugin/real_plugin.py runs it: in a mount namespace of its own, where its fixed
/var/lib/kubelet/device-plugins is the test's directory (it watches that directory before it reads its config,
cmd/nvidia-device-plugin/main.go `start`, v0.20.0, and stops there where it is missing), beside the in-process
kubelet of tests/deviceplugin/kubelet_fake.py. Each outcome is one only a run that read the config can give: the
refusal, or the devices the config makes advertised to the kubelet."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpu_stack_dev.chartlib import render

from tests.deviceplugin.kubelet_fake import FakeKubelet, Watch
from tests.deviceplugin.real_plugin import RealPlugin, RealPluginUnavailable
from tests.require import skip_or_fail

OVERLAY = "time-slicing-t4-x4.yaml"
REPLICAS = "sharing.configs.ts-t4-x4.timeSlicing.resources"
REFUSAL = "number of replicas must be >= 2"  # api/config/v1/replicas.go, v0.20.0
LOADED = "Running with config:"  # cmd/nvidia-device-plugin/main.go startPlugins, v0.20.0, after the config is read
GPUS = 2


def with_replicas(replicas: int) -> dict[str, object]:
    return {REPLICAS: [{"name": "nvidia.com/gpu", "replicas": replicas}]}


def rendered_config(replicas: int) -> str:
    (configmap,) = [o for o in render(3, OVERLAY, with_replicas(replicas)).objects()
                    if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("device-plugin-configs")]
    config: str = configmap["data"]["ts-t4-x4"]
    return config


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A short directory: a unix socket path must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gsrc-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def real_plugin(config: str, plugin_dir: Path, work: Path) -> RealPlugin:
    try:
        return RealPlugin(render(3, OVERLAY, with_replicas(2)).objects(), plugin_dir, work, gpus=GPUS,
                          config_text=config)
    except RealPluginUnavailable as exc:
        skip_or_fail(str(exc))


def loaded_config(log: str) -> dict[str, object]:
    """The config the binary prints once it has read and completed it."""
    assert LOADED in log, log
    config, _ = json.JSONDecoder().raw_decode(log, log.index("{", log.index(LOADED)))
    assert isinstance(config, dict)
    return config


def test_the_render_refuses_what_the_real_plugin_refuses(plugin_dir: Path, tmp_path: Path) -> None:
    refused = render(3, OVERLAY, with_replicas(1))
    assert not refused.ok
    assert "gpu-stack:" in refused.stderr and REFUSAL in refused.stderr
    # the config the chart would have written, had it let replicas 1 through
    config = rendered_config(2).replace("replicas: 2", "replicas: 1")
    with FakeKubelet(plugin_dir), real_plugin(config, plugin_dir, tmp_path) as plugin:
        status = plugin.wait(timeout=60)
        log = plugin.output()
    assert status != 0 and REFUSAL in log, log
    assert LOADED not in log


def test_the_real_plugin_loads_the_config_the_chart_renders(plugin_dir: Path, tmp_path: Path) -> None:
    with FakeKubelet(plugin_dir) as kubelet, real_plugin(rendered_config(2), plugin_dir, tmp_path) as plugin:
        registered = kubelet.registered(1, timeout=60)
        watch = Watch(kubelet.client(registered["nvidia.com/gpu"].endpoint))
        devices = watch.next(timeout=30)
        watch.cancel()
        log = plugin.output()
    sharing = loaded_config(log)["sharing"]
    assert sharing["timeSlicing"]["resources"][0]["replicas"] == 2, log  # type: ignore[index]
    assert len(devices) == GPUS * 2 and all("::" in d for d in devices)
