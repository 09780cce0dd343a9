"""Installs of their own on the real node: every overlay the node can serve with `helm install --wait`, and an
image that cannot start. (A release's cluster-scoped objects, e.g. its RuntimeClass, exclude a second release
of the chart at the same time: each test here installs, checks and uninstalls.)"""

from __future__ import annotations

import re

import pytest
from gpu_stack_dev.e2e.e2elib import E2ECluster, Releases, overlays, unique

from .conftest import install_and_wait

# Overlays whose install needs another project running (its CRDs and controller, or the GPU agents whose
# configuration the policy-only overlays read): not served by this node.
NEEDS_OTHER_PROJECTS = {"monitoring-prometheus-operator.yaml", "webhook-cert-manager.yaml",
                        "policy-only-gpu-operator.yaml", "policy-only-device-plugin.yaml"}


@pytest.mark.parametrize("overlay", [o for o in overlays() if o not in NEEDS_OTHER_PROJECTS])
def test_every_overlay_the_node_can_serve_installs_and_waits(cluster: E2ECluster, releases: Releases,
                                                             overlay: str) -> None:
    release = install_and_wait(releases, overlay, name=unique("ov"))
    pods = cluster.get_json("pods", "-n", release.namespace, "-l", release.selector)["items"]
    assert pods, "no pods"
    assert all({c["type"]: c["status"] for c in p["status"]["conditions"]}.get("Ready") == "True" for p in pods)
    releases.uninstall(release)


def test_an_image_that_cannot_start_fails_with_what_the_pod_says(cluster: E2ECluster, releases: Releases) -> None:
    """Bad input: an image without the webhook's entrypoint (busybox). The failure names the pod and carries
    the runtime's own words about the missing executable."""
    with pytest.raises(pytest.fail.Exception) as failed:
        install_and_wait(releases, name=unique("bad"), timeout="45s",
                         **{"webhook.image.repository": "localhost/busybox", "webhook.image.tag": "e2e"})
    message = str(failed.value)
    assert "helm install --wait failed" in message
    assert re.search(r"=== pod \S+/\S+-webhook-\S+", message), message
    assert re.search(r'"gpu-stack-webhook".*(not found|no such file)', message, re.IGNORECASE), message
