"""Every component image default is the release NVIDIA's GPU Operator v26.7.0 ships, and its values
comment names that release.

Upstream facts (NVIDIA/gpu-operator tag v26.7.0):
- deployments/gpu-operator/values.yaml: toolkit.version v1.20.0 (nvcr.io/nvidia/k8s/container-toolkit),
  devicePlugin.version and gfd.version v0.20.0 (nvcr.io/nvidia/k8s-device-plugin),
  migManager.version v0.15.0 (nvcr.io/nvidia/cloud-native/k8s-mig-manager),
  dcgmExporter.version 4.6.0-4.8.3-distroless (nvcr.io/nvidia/k8s/dcgm-exporter).
- deployments/gpu-operator/Chart.yaml: dependency node-feature-discovery 0.19.0
  (registry.k8s.io/nfd/charts), whose image is registry.k8s.io/nfd/node-feature-discovery:v0.19.0.
"""

from __future__ import annotations

import re

import pytest

from .chartlib import CHART, load_values

GPU_OPERATOR = "GPU Operator v26.7.0"
UPSTREAM = {
    # values section: (repository, tag)
    "devicePlugin": ("nvcr.io/nvidia/k8s-device-plugin", "v0.20.0"),
    "toolkit": ("nvcr.io/nvidia/k8s/container-toolkit", "v1.20.0"),
    "migManager": ("nvcr.io/nvidia/cloud-native/k8s-mig-manager", "v0.15.0"),
    "dcgmExporter": ("nvcr.io/nvidia/k8s/dcgm-exporter", "4.6.0-4.8.3-distroless"),
    "nfd": ("registry.k8s.io/nfd/node-feature-discovery", "v0.19.0"),
}


@pytest.mark.parametrize("section", sorted(UPSTREAM))
def test_image_default_is_the_gpu_operator_release(section: str) -> None:
    image = load_values()[section]["image"]
    assert (image["repository"], image["tag"]) == UPSTREAM[section]


@pytest.mark.parametrize("section", sorted(UPSTREAM))
def test_tag_comment_names_the_upstream_release(section: str) -> None:
    text = (CHART / "values.yaml").read_text(encoding="utf-8")
    block = re.search(rf"^{section}:\n(.*?)^\S", text, re.S | re.M)
    assert block, section
    comment = re.search(r"# -- (.*)\n\s+tag:", block.group(1))
    assert comment, f"{section}.image.tag has no comment"
    assert GPU_OPERATOR in comment.group(1)
    version = UPSTREAM[section][1]
    assert version in comment.group(1) or version.lstrip("v") in comment.group(1)
