"""A release installed the way users install one: `make release` output pushed to a real registry on the node's
network (gpu_stack_dev.registry: Debian's docker-registry over TLS with a test CA and htpasswd auth), the
chart installed with `helm install gpu-stack oci://<registry>/charts/gpu-stack --version x.y.z`, the webhook
image pulled by the kubelet through containerd with an imagePullSecrets Secret and the registry's CA trusted
by containerd (hosts.toml), not imported.

Two releases are cut from a throwaway checkout (tests/release/checkout.py): 0.1.0 as the tree stands, then
0.2.0 after `release-prepare`. Their images are the one `make e2e-image` built, committed once per version
with the version label (a digest each) instead of being built twice; everything else is `make release`'s.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from gpu_stack_dev import node
from gpu_stack_dev.e2e.e2elib import E2ECluster, Release, Releases, unique
from gpu_stack_dev.e2e.node_install import IMAGE, IMAGE_ARCHIVE, INSTALL_SET, webhook_pods
from gpu_stack_dev.registry import Registry

from tests.release.checkout import commit, make_checkout, prebuilt_engine_path, run_release

from .podlogs import explain_pods
from .standin import wait_for
from .test_drills import Admissions

PREVIOUS, NEW = "0.1.0", "0.2.0"
REPOSITORY = "gpu-stack/gpu-stack-webhook"  # the released chart's default, ghcr.io/gpu-stack/gpu-stack-webhook


@dataclass(frozen=True)
class Published:
    registry: Registry
    chart: str  # oci://<host>/charts/gpu-stack
    digests: dict[str, str]  # version -> the digest the release's .digest file names
    pushed: dict[str, str]  # version -> the digest the registry answered the push with


@pytest.fixture(scope="module")
def published(real_node: node.Node, cluster: E2ECluster, node_registry: Registry,
              tmp_path_factory: pytest.TempPathFactory) -> Published:
    where = tmp_path_factory.mktemp("registry-release")
    repo = make_checkout(where)
    # the image in buildah's storage when buildah built it (no import), else the archive any engine writes
    in_storage = subprocess.run(["buildah", "inspect", "--type", "image", IMAGE], capture_output=True, check=False)
    path, env = prebuilt_engine_path(where, IMAGE if in_storage.returncode == 0 else f"docker-archive:{IMAGE_ARCHIVE}")
    started = time.monotonic()
    digests, pushes = {}, {}
    # each release is pushed while the next one is cut
    with ThreadPoolExecutor(2) as pool:
        for version in (PREVIOUS, NEW):
            if version == NEW:
                prepared = run_release(repo, path, "prepare", version)
                assert prepared.returncode == 0, prepared.stderr
                commit(repo, f"gpu-stack {version}")
            built = run_release(repo, path, "build", version, helm=cluster.helm3_bin, extra_env=env)
            subprocess.run(["buildah", "rmi", f"ghcr.io/{REPOSITORY}:{version}"], check=False, capture_output=True)
            assert built.returncode == 0, built.stdout + built.stderr
            out = repo / "dist" / version
            digests[version] = (out / f"gpu-stack-webhook-{version}.digest").read_text().strip()
            pushes[version] = pool.submit(node_registry.push_archive, out / f"gpu-stack-webhook-{version}.oci.tar",
                                          REPOSITORY, version)
    for version in (PREVIOUS, NEW):
        chart = node_registry.push_chart(repo / "dist" / version / f"gpu-stack-{version}.tgz", cluster.helm3_bin)
    print(f"releases cut and published in {time.monotonic() - started:.1f}s")
    return Published(node_registry, chart, digests, {version: push.result() for version, push in pushes.items()})


def helm_from_registry(cluster: E2ECluster, published: Published, verb: str, release: Release, version: str,
                       *values: str, wait: str = "4m", check: bool = True) -> str:
    """`helm install|upgrade <release> oci://<registry>/charts/gpu-stack --version <version>` with the registry
    as a mirror of the chart's default one, the pull secret and this machine's INSTALL_SET."""
    sets = [f"webhook.image.registry={published.registry.host}", *values]
    args = [verb, release.name, published.chart, "--version", version, "-n", release.namespace,
            *published.registry.helm_flags(), "--wait", "--timeout", wait]
    for key, value in INSTALL_SET.items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    for s in sets:
        args += ["--set", s]
    proc = cluster.helm(*args, check=False, timeout=400)
    if check and proc.returncode:
        pytest.fail(f"helm {verb} failed:\n{proc.stderr}\n{explain_pods(cluster, release.namespace)}")
    return proc.stderr


def running_images(cluster: E2ECluster, release: Release) -> set[tuple[str, str]]:
    """(the image the pod asks for, the imageID the node runs) of each live webhook pod."""
    return {(p["spec"]["containers"][0]["image"], c["imageID"]) for p in webhook_pods(cluster, release)
            if not p["metadata"].get("deletionTimestamp") for c in p["status"].get("containerStatuses", [])}


def test_a_wrong_pull_secret_fails_the_install_with_the_registrys_401(
        cluster: E2ECluster, published: Published) -> None:
    # before `from_registry` exists: a second release would collide with its cluster-scoped objects
    helper = Releases(cluster)
    release = Release("wrong-secret", cluster.create_namespace(unique("wrong-secret")))
    helper.namespaces.append(release.namespace)
    helper.installed.append(release)
    try:
        secret = published.registry.pull_secret(cluster, release.namespace, password="not-the-password")
        # helm's wait only runs out: the pods' pull error is awaited below, not within it
        failed = helm_from_registry(cluster, published, "install", release, NEW,
                                    f"webhook.imagePullSecrets[0].name={secret}", wait="15s", check=False)

        def pull_errors() -> list[str]:
            events = cluster.get_json("events", "-n", release.namespace, "--field-selector", "reason=Failed")["items"]
            return [e["message"] for e in events if "ErrImagePull" in e["message"] or "pull" in e["message"]]
        wait_for(lambda: any("401 Unauthorized" in m for m in pull_errors()), "the pull's 401", timeout=90)
        waiting = [c["state"]["waiting"] for p in webhook_pods(cluster, release)
                   for c in p["status"].get("containerStatuses", []) if "waiting" in c["state"]]
        assert waiting, f"{failed}\n{explain_pods(cluster, release.namespace)}"
        assert {w["reason"] for w in waiting} <= {"ErrImagePull", "ImagePullBackOff"}, waiting
        assert any("401 Unauthorized" in m for m in pull_errors()), pull_errors()
        # Helm names the Deployment its wait gave up on; the pull error is the pods' (kubectl describe)
        assert (f"resource Deployment/{release.namespace}/{release.fullname}-webhook not ready. status: "
                "InProgress, message: Available: 0/2") in failed, failed
    finally:
        helper.cleanup()


@pytest.fixture(scope="module")
def from_registry(cluster: E2ECluster, published: Published) -> Iterator[Release]:
    """The previous release installed from the registry with a pull secret: no image flag but the mirror."""
    helper = Releases(cluster)
    release = Release("gpu-stack", cluster.create_namespace(unique("from-registry")))
    helper.namespaces.append(release.namespace)
    helper.installed.append(release)
    try:
        secret = published.registry.pull_secret(cluster, release.namespace)
        helm_from_registry(cluster, published, "install", release, PREVIOUS,
                           f"webhook.imagePullSecrets[0].name={secret}")
        yield release
    finally:
        helper.cleanup()


def test_the_registry_serves_the_digest_the_release_names(published: Published) -> None:
    assert published.pushed == published.digests
    assert published.digests[PREVIOUS] != published.digests[NEW]


def test_the_node_pulls_the_released_image_with_the_pull_secret(
        cluster: E2ECluster, published: Published, from_registry: Release, real_node: node.Node) -> None:
    image = f"{published.registry.host}/{REPOSITORY}"
    assert running_images(cluster, from_registry) == {
        (f"{image}:{PREVIOUS}", f"{image}@{published.digests[PREVIOUS]}")}
    pod = webhook_pods(cluster, from_registry)[0]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "registry-pull"}]
    pulled = cluster.get_json("events", "-n", from_registry.namespace, "--field-selector", "reason=Pulled")["items"]
    print("\n".join(e["message"] for e in pulled))  # the kubelet's "Successfully pulled image ... in <time>"
    listed = real_node.ctr("images", "ls", "-q").stdout.split()
    assert f"{image}:{PREVIOUS}" in listed  # pulled by name through the registry, not imported


def test_an_upgrade_to_the_pinned_new_release_keeps_the_webhook_answering_and_rollback_restores_it(
        cluster: E2ECluster, published: Published, from_registry: Release) -> None:
    image = f"{published.registry.host}/{REPOSITORY}"
    load_namespace = cluster.create_namespace(unique("load"))
    load = Admissions(cluster, load_namespace)
    with load.running():
        time.sleep(3)
        helm_from_registry(cluster, published, "upgrade", from_registry, NEW, "webhook.imagePullSecrets[0].name="
                           "registry-pull", f"webhook.image.digest={published.digests[NEW]}")
        upgraded = running_images(cluster, from_registry)
        time.sleep(3)
    assert upgraded == {(f"{image}@{published.digests[NEW]}", f"{image}@{published.digests[NEW]}")}
    assert set(load.verdicts("bad-gpu")) == {"denied"}, str(load)
    assert set(load.verdicts("good-gpu")) == {"admitted"}, str(load)
    assert set(load.verdicts("plain")) == {"admitted"}, str(load)

    cluster.helm("rollback", from_registry.name, "1", "-n", from_registry.namespace, "--wait", "--timeout", "4m",
                 timeout=300)
    assert running_images(cluster, from_registry) == {
        (f"{image}:{PREVIOUS}", f"{image}@{published.digests[PREVIOUS]}")}
    cluster.kubectl("delete", "namespace", load_namespace, "--wait=false")
