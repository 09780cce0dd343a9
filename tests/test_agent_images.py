"""The NVIDIA agents' images `make e2e-image` builds for the real node (gpu_stack_dev.e2e.agent_images) carry
exactly the names and tags the chart renders for the agents' pods, so the node runs the DaemonSets unchanged."""

from __future__ import annotations

from gpu_stack_dev.chartlib import render
from gpu_stack_dev.e2e import agent_images

# the overlays that render every agent built here: device plugin, GFD (default), MPS daemon, MIG manager, DRA plugin
OVERLAYS = ("default", "mps-x10.yaml", "mig-mixed-all-balanced.yaml", "dra.yaml")
NOT_BUILT = ("dcgm-exporter", "nvcr.io/nvidia/driver", "node-feature-discovery", "gpu-stack-webhook", "kubectl")


def agent_images_rendered(set_json: dict[str, object] | None = None) -> set[str]:
    images = set()
    for overlay in OVERLAYS:
        for obj in render(3, overlay, set_json=set_json).objects():
            if obj["kind"] != "DaemonSet":
                continue
            spec = obj["spec"]["template"]["spec"]
            images |= {c["image"] for c in spec.get("initContainers", []) + spec["containers"]}
    return {image for image in images if not any(skip in image for skip in NOT_BUILT)}


def test_every_agent_image_the_chart_renders_is_built_under_that_name() -> None:
    rendered = agent_images_rendered()
    assert rendered == set(agent_images.refs().values()), rendered


def test_the_values_pointing_at_the_nodes_registry_render_exactly_the_pushed_refs() -> None:
    """What the node tests install with (agent_images.install_values): the agents' pods name the images pushed to
    the node's registry, under nvcr.io's paths and the chart's tags."""
    pulled = {agent: agent_images.mirrored(ref, "10.77.0.1:5443") for agent, ref in agent_images.refs().items()}
    assert pulled["device-plugin"] == "10.77.0.1:5443/nvidia/k8s-device-plugin:v0.20.0"
    rendered = agent_images_rendered(agent_images.chart_values(pulled, "pull"))
    assert rendered == set(pulled.values()), rendered
