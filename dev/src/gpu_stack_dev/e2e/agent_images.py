"""The NVIDIA node agents' images for the real node: built from ../shared/gpu-node's upstream binaries by
hack/image/nvidia-agent-images.sh under the names and tags the chart renders, and imported into the node the
way the webhook image is (`Node.load_image`). Another way of getting them to the node (a registry) replaces
`load` only: the names come from the chart's values either way.

    refs()            {"device-plugin": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0", ...}
    build()           the archives (kept when they exist), NodeImagesError with the script's stderr otherwise
    load(node)        build() and import them into the node's containerd
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from gpu_stack_dev import chartlib, node
from gpu_stack_dev.paths import ROOT

SCRIPT = ROOT / "hack" / "image" / "nvidia-agent-images.sh"
# (archive name, values key of the image, script variable)
IMAGES = {
    "device-plugin": ("k8s-device-plugin", "devicePlugin", "REF_DEVICE_PLUGIN"),
    "toolkit": ("container-toolkit", "toolkit", "REF_TOOLKIT"),
    "mig-manager": ("k8s-mig-manager", "migManager", "REF_MIG_MANAGER"),
    "dra": ("dra-driver", "dra", "REF_DRA"),
}


class AgentImagesError(RuntimeError):
    pass


def refs(values: dict[str, Any] | None = None) -> dict[str, str]:
    """The image each agent's pods name with the chart's default values (`gpu-stack.image`: repository:tag)."""
    values = values or chartlib.load_values()
    return {agent: f"{values[key]['image']['repository']}:{values[key]['image']['tag']}"
            for agent, (_, key, _) in IMAGES.items()}


def archives(directory: Path = node.IMAGES_DIR) -> dict[str, Path]:
    return {agent: directory / f"{archive}.tar" for agent, (archive, _, _) in IMAGES.items()}


def build(directory: Path = node.IMAGES_DIR) -> dict[str, Path]:
    env = {**os.environ, **{variable: refs()[agent] for agent, (_, _, variable) in IMAGES.items()}}
    proc = subprocess.run([str(SCRIPT), str(directory)], env=env, capture_output=True, text=True, check=False,
                          timeout=900)
    if proc.returncode:
        raise AgentImagesError(f"{SCRIPT.name} failed:\n{proc.stderr[-3000:]}")
    return archives(directory)


def load(real_node: node.Node, directory: Path = node.IMAGES_DIR) -> dict[str, str]:
    """Build (once) and import every agent image into the node; returns the refs the node now has."""
    real_node.load_image(*build(directory).values())
    return refs()


if __name__ == "__main__":  # make e2e-image: python -m gpu_stack_dev.e2e.agent_images
    for agent, archive in build().items():
        print(f"e2e-image: {refs()[agent]} ({agent}), {archive.stat().st_size // 1000000} MB uncompressed")
