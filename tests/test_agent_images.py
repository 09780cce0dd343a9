"""The NVIDIA agents' images `make e2e-image` builds for the real node (gpu_stack_dev.e2e.agent_images) carry
exactly the names and tags the chart renders for the agents' pods, so the node runs the DaemonSets unchanged."""

from __future__ import annotations

from gpu_stack_dev.chartlib import render
from gpu_stack_dev.e2e import agent_images

# the overlays that render every agent built here: device plugin, GFD (default), MPS daemon, MIG manager, DRA plugin
OVERLAYS = ("default", "mps-x10.yaml", "mig-mixed-all-balanced.yaml", "dra.yaml")
NOT_BUILT = ("dcgm-exporter", "nvcr.io/nvidia/driver", "node-feature-discovery", "gpu-stack-webhook", "kubectl")


def agent_images_rendered() -> set[str]:
    images = set()
    for overlay in OVERLAYS:
        for obj in render(3, overlay).objects():
            if obj["kind"] != "DaemonSet":
                continue
            spec = obj["spec"]["template"]["spec"]
            images |= {c["image"] for c in spec.get("initContainers", []) + spec["containers"]}
    return {image for image in images if not any(skip in image for skip in NOT_BUILT)}


def test_every_agent_image_the_chart_renders_is_built_under_that_name() -> None:
    rendered = agent_images_rendered()
    assert rendered == set(agent_images.refs().values()), rendered
