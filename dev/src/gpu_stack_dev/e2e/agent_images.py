"""The NVIDIA node agents' images for the real node: built from ../shared/gpu-node's upstream binaries by
hack/image/nvidia-agent-images.sh under the names and tags the chart renders, pushed to the node's private
registry (gpu_stack_dev.registry) and pulled from there by the kubelet through containerd, as a cluster that
mirrors nvcr.io into a registry of its own pulls them: the chart's image repositories point at the registry,
and `global.imagePullSecrets` names its pull secret.

    refs()                 {"device-plugin": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0", ...}
    build()                the archives (kept when they exist), AgentImagesError with the script's stderr otherwise
    serve_from(node, reg)  the registry the node's agents pull from (the node tests' conftest, once per node)
    load(node)             build() and push them to that registry (once, in parallel); the refs the pods pull
    install_values(node, namespace)  those refs as chart values, and the pull secret in `namespace`
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_stack_dev import chartlib, node
from gpu_stack_dev.e2e.e2elib import E2ECluster
from gpu_stack_dev.paths import ROOT
from gpu_stack_dev.registry import Registry

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


PULL_SECRET = "agent-images-pull"


@dataclass
class Served:
    """The agent images in one node's registry: `refs` (agent -> <registry>/<nvcr.io path>:tag) once pushed."""
    registry: Registry
    refs: dict[str, str] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_SERVED: dict[Path, Served] = {}  # node directory -> its registry


def serve_from(real_node: node.Node, registry: Registry) -> None:
    """The registry the node's agent pods pull from; containerd trusts its CA (hosts.toml)."""
    registry.trust_from(real_node)
    _SERVED[real_node.dir] = Served(registry)


def served(real_node: node.Node) -> Served:
    try:
        return _SERVED[real_node.dir]
    except KeyError:
        raise AgentImagesError(f"no registry serves node {real_node.name}: agent_images.serve_from(node, registry) "
                               "first (tests/e2e/node/conftest.py's real_node does)") from None


def mirrored(ref: str, host: str) -> str:
    """nvcr.io/nvidia/x:tag -> <host>/nvidia/x:tag: the path a mirror of the upstream registry keeps."""
    return f"{host}/{ref.split('/', 1)[1]}"


def load(real_node: node.Node, directory: Path = node.IMAGES_DIR) -> dict[str, str]:
    """Build (once) every agent image and push it (once per node, all at once) to the node's registry; returns
    the refs the node's pods pull them by."""
    serving = served(real_node)
    with serving.lock:
        if not serving.refs:
            built = build(directory)
            wanted = {agent: mirrored(ref, serving.registry.host) for agent, ref in refs().items()}

            def push(agent: str) -> str:
                repository, tag = wanted[agent].split("/", 1)[1].rsplit(":", 1)
                return serving.registry.push_archive(built[agent], repository, tag)
            started = time.monotonic()
            with ThreadPoolExecutor(len(built)) as pool:
                serving.digests = dict(zip(built, pool.map(push, built), strict=True))
            serving.refs = wanted
            print(f"agent images pushed to {serving.registry.host} in {time.monotonic() - started:.1f}s")
    return dict(serving.refs)


def install_values(real_node: node.Node, cluster: E2ECluster, namespace: str) -> dict[str, object]:
    """Values pointing the chart's agents at the node's registry (`<key>.image.repository`) and
    `global.imagePullSecrets` at its pull secret, which is created in `namespace` (created when missing)."""
    pulled = load(real_node)
    cluster.kubectl("create", "namespace", namespace, check=False)
    secret = served(real_node).registry.pull_secret(cluster, namespace, name=PULL_SECRET)
    return chart_values(pulled, secret)


def chart_values(pulled: dict[str, str], secret: str) -> dict[str, object]:
    """Each agent's `image.repository` set to where `pulled` says (the tags stay the chart's), and the secret."""
    values: dict[str, object] = {"global.imagePullSecrets": [{"name": secret}]}
    for agent, (_, key, _) in IMAGES.items():
        values[f"{key}.image.repository"] = pulled[agent].rsplit(":", 1)[0]
    return values


if __name__ == "__main__":  # make e2e-image: python -m gpu_stack_dev.e2e.agent_images
    for agent, archive in build().items():
        print(f"e2e-image: {refs()[agent]} ({agent}), {archive.stat().st_size // 1000000} MB uncompressed")
