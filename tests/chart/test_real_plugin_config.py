"""A sharing config the real device plugin would refuse fails the render with a gpu-stack: message, never a crash
loop on the nodes: the chart's check quotes the refusal of k8s-device-plugin v0.20.0 itself, run here on the
config file the chart would have written (../shared/gpu-node's binary, NVIDIA's mock NVML)."""

from __future__ import annotations

import os
import subprocess

from gpu_stack_dev.chartlib import render
from gpu_stack_dev.e2e import mock_gpu

from tests.gpu_node import unpacked_or_skip

OVERLAY = "time-slicing-t4-x4.yaml"
REPLICAS = "sharing.configs.ts-t4-x4.timeSlicing.resources"
REFUSAL = "number of replicas must be >= 2"  # api/config/v1/replicas.go, v0.20.0


def with_replicas(replicas: int) -> dict[str, object]:
    return {REPLICAS: [{"name": "nvidia.com/gpu", "replicas": replicas}]}


def plugin_config_load(config: str, tmp_path: os.PathLike[str]) -> str:
    """What the real nvidia-device-plugin logs loading `config` (it stops there when it refuses it)."""
    files = unpacked_or_skip()
    path = f"{tmp_path}/config.yaml"
    with open(path, "w") as out:
        out.write(config)
    env = {"LD_LIBRARY_PATH": str(files), "MOCK_NVML_CONFIG": str(files / "profiles" / mock_gpu.PROFILES["t4"])}
    try:
        proc = subprocess.run([str(files / "nvidia-device-plugin"), f"--config-file={path}"], env=env,
                              capture_output=True, text=True, timeout=10, check=False)
    except subprocess.TimeoutExpired as running:  # accepted the config and went on to serve
        return (running.stderr or b"").decode() if isinstance(running.stderr, bytes) else str(running.stderr or "")
    return proc.stderr


def rendered_config(replicas: int) -> str:
    (configmap,) = [o for o in render(3, OVERLAY, with_replicas(replicas)).objects()
                    if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("device-plugin-configs")]
    config: str = configmap["data"]["ts-t4-x4"]
    return config


def test_the_render_refuses_what_the_real_plugin_refuses(tmp_path: os.PathLike[str]) -> None:
    refused = render(3, OVERLAY, with_replicas(1))
    assert not refused.ok
    assert "gpu-stack:" in refused.stderr and REFUSAL in refused.stderr
    # the config the chart would have written, had it let replicas 1 through
    config = rendered_config(2).replace("replicas: 2", "replicas: 1")
    assert REFUSAL in plugin_config_load(config, tmp_path)


def test_the_real_plugin_loads_the_config_the_chart_renders(tmp_path: os.PathLike[str]) -> None:
    log = plugin_config_load(rendered_config(2), tmp_path)
    assert "unable to load config" not in log and REFUSAL not in log
