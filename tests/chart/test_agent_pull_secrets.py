"""A cluster that pulls the NVIDIA agents from a private registry or a mirror of nvcr.io sets each agent's
`image.repository` to it and names its pull secret once, in `global.imagePullSecrets` (the node tests do:
gpu_stack_dev.e2e.agent_images). Every DaemonSet of every overlay then carries the secret, and the mirrored
repositories are the only images its pods name. The overlays together run every agent but the driver
(the last test)."""

from __future__ import annotations

from typing import Any

import pytest
from gpu_stack_dev.chartlib import FULLNAME, find, load_values, overlays, render

MIRROR = "registry.example.com:5443"
SECRET = {"name": "mirror-pull"}
AGENTS = ("devicePlugin", "toolkit", "migManager", "dra", "dcgmExporter", "driver", "nfd")


def mirrored(overlay: str) -> list[dict[str, Any]]:
    values = load_values()
    set_json: dict[str, Any] = {"global.imagePullSecrets": [SECRET]}
    for agent in AGENTS:
        upstream = values[agent]["image"]["repository"]
        set_json[f"{agent}.image.repository"] = f"{MIRROR}/{upstream.split('/', 1)[1]}"
    return find(render(3, overlay, set_json=set_json).objects(), "DaemonSet")


# the policy-only overlays run no agent
@pytest.mark.parametrize("overlay", [o for o in overlays() if not o.startswith("policy-only")])
def test_every_agent_daemonset_pulls_from_the_mirror_with_the_global_secret(overlay: str) -> None:
    daemonsets = mirrored(overlay)
    assert daemonsets
    for daemonset in daemonsets:
        pod = daemonset["spec"]["template"]["spec"]
        assert SECRET in pod.get("imagePullSecrets", []), daemonset["metadata"]["name"]
        images = {c["image"] for c in pod.get("initContainers", []) + pod["containers"]}
        assert all(image.startswith(f"{MIRROR}/") for image in images), (daemonset["metadata"]["name"], images)


def test_the_overlays_together_run_every_agent_daemonset() -> None:
    """(The driver's DaemonSet is in no overlay.)"""
    names = {d["metadata"]["name"].removeprefix(f"{FULLNAME}-") for o in overlays() for d in mirrored(o)}
    assert {"device-plugin", "gpu-feature-discovery", "mps-control-daemon", "container-toolkit", "mig-manager",
            "dra-kubelet-plugin", "dcgm-exporter", "nfd-worker"} <= names, names
