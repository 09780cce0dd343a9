"""The fleet's GPU labels (gpu_stack_dev.e2e.fleet, what the API-server tests' nodes carry) against the labels the
real gpu-feature-discovery v0.20.0 writes on NVIDIA's mock NVML for the same device plugin config, the one the
chart renders: a fleet that labels a node otherwise than GFD would fails here.

The mock's A100 profile is the fleet's NVIDIA-A100-SXM4-40GB (same product name and memory). The driver version
is a fact of the node, not of the config, so it is left out; so are the labels the fleet does not publish."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from gpu_stack_dev.chartlib import render
from gpu_stack_dev.e2e import mock_gpu
from gpu_stack_dev.e2e.fleet import ChartSharing, NodeSpec, plan

from tests.gpu_node import unpacked_or_skip

from .real_plugin import plugin_config

GPUS = 2
# (overlay, device plugin config; None: the chart's default)
CONFIGS = [
    ("default", None),
    ("exclusive.yaml", None),
    ("time-slicing-t4-x4.yaml", None),
    ("time-slicing-2080ti-x6.yaml", None),
    ("mps-x10.yaml", None),
    ("per-node-configs.yaml", "ts-x4"),
    ("per-node-configs.yaml", "mps-x10"),
]
NODE_FACTS = {"nvidia.com/cuda.driver-version.full"}
NOT_GFD = {
    "nvidia.com/gpu.present",  # the chart's NFD rule writes it (templates/gpu-nodes/nodefeaturerule.yaml)
    "nvidia.com/device-plugin.config",  # the user's label choosing the config
}


def real_gfd_labels(config: str, work: Path) -> dict[str, str]:
    files = unpacked_or_skip()
    (work / "profile.yaml").write_text(mock_gpu.trimmed_profile("a100", GPUS))
    (work / "config.yaml").write_text(config)
    out = work / "labels"
    proc = subprocess.run(
        [str(files / "gpu-feature-discovery"), "--oneshot", "--no-timestamp", "--use-node-feature-api=false",
         f"--output-file={out}", f"--config-file={work / 'config.yaml'}"],
        env={"LD_LIBRARY_PATH": str(files), "MOCK_NVML_CONFIG": str(work / "profile.yaml")},
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)


@pytest.mark.parametrize(("overlay", "config"), CONFIGS)
def test_the_fleet_labels_a_node_as_the_real_gfd_does(overlay: str, config: str | None, tmp_path: Path) -> None:
    objects = render(4, overlay).objects()
    real = real_gfd_labels(plugin_config(objects, config), tmp_path)
    fleet = plan(NodeSpec("node1", gpus=GPUS, model="NVIDIA-A100-SXM4-40GB", config=config),
                 ChartSharing.from_objects(objects)).labels
    compared = sorted(k for k in fleet if k.startswith("nvidia.com/") and k not in NODE_FACTS | NOT_GFD)
    assert {k: fleet[k] for k in compared} == {k: real.get(k) for k in compared}
