"""How the chart is installed on the real node, shared by the node tests and bench/pod_startup.py: the image
`make e2e-image` built, and the few values this machine needs (INSTALL_SET, each with its reason)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpu_stack_dev import node
from gpu_stack_dev.paths import ROOT

from .e2elib import E2ECluster, Release

IMAGE = os.environ.get("E2E_IMAGE", "localhost/gpu-stack-webhook:e2e")
IMAGE_ARCHIVE = Path(os.environ.get("E2E_IMAGE_ARCHIVE", ROOT / ".tools" / "images" / "gpu-stack-webhook-e2e.tar"))
TEST_NAMESPACE = "gpu-stack-helm-test"
# What this machine needs beside the image, each for a reason a user would not have:
# - nfd.enabled=false: NFD's images cannot be pulled here (no registry), and a Deployment that never becomes
#   Ready fails `--wait`. A cluster that already runs NFD installs the same way.
# - helmTests.kubectlImage: `helm test` runs kubectl with bash; registry.k8s.io/kubectl cannot be pulled, so
#   a stand-in with bash and the same kubectl v1.36 (hack/image/node-images.sh) runs instead.
# - helmTests.cudaSample=false, helmTests.bringUp=false: the CUDA sample needs a GPU, and the bring-up test
#   waits for the GPU agents' DaemonSets to run on GPU nodes; there are none here.
# - helmTests.namespace: the denial test runs only in a namespace the webhook covers (NOTES says so).
INSTALL_SET = {
    "nfd.enabled": False,
    "webhook.helmTests.kubectlImage": node.KUBECTL_IMAGE,
    "webhook.helmTests.cudaSample": False,
    "webhook.helmTests.bringUp": False,
    "webhook.helmTests.namespace": TEST_NAMESPACE,
}


def image_parts(image: str = IMAGE) -> tuple[str, str]:
    repository, _, tag = image.rpartition(":")
    return repository, tag


def install_values(**extra: object) -> dict[str, object]:
    repository, tag = image_parts()
    return {"webhook.image.repository": repository, "webhook.image.tag": tag, **INSTALL_SET, **extra}


def webhook_pods(cluster: E2ECluster, release: Release) -> list[dict[str, Any]]:
    """The release's webhook pods, terminating ones included."""
    selector = f"{release.selector},app.kubernetes.io/component=webhook"
    pods: list[dict[str, Any]] = cluster.get_json("pods", "-n", release.namespace, "-l", selector)["items"]
    return pods
