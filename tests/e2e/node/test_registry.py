"""A release installed the way users install one: `make release` output published by `make release-publish`
to a real registry on the node's network (gpu_stack_dev.registry: Debian's docker-registry over TLS with a test
CA and htpasswd auth), the chart installed with `helm install gpu-stack oci://<registry>/gpu-stack/charts/gpu-stack
--version x.y.z` and no image flag, the webhook image pulled by the kubelet through containerd by the digest
the registry serves, with an imagePullSecrets Secret and the registry's CA trusted by containerd (hosts.toml),
not imported.

Two releases are cut from a throwaway checkout (tests/release/checkout.py): 0.1.0 as the tree stands, then
0.2.0 after `release-prepare`. Their images are the one `make e2e-image` built, committed once per version
with the version label (a digest each) instead of being built twice; everything else is `make release`'s and
`make release-publish`'s (hack/release.py build, publish).
"""

from __future__ import annotations

import json
import subprocess
import tarfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from gpu_stack_dev import node
from gpu_stack_dev.e2e.e2elib import E2ECluster, Release, Releases, unique
from gpu_stack_dev.e2e.node_install import IMAGE, IMAGE_ARCHIVE, INSTALL_SET, webhook_pods
from gpu_stack_dev.registry import Registry

from tests.release.checkout import commit, make_checkout, prebuilt_engine_path, run_release

from .podlogs import explain_pods
from .standin import wait_for
from .test_drills import Admissions

PREVIOUS, NEW = "0.1.0", "0.2.0"
PROJECT = "gpu-stack"  # make release-publish REGISTRY=<host>/gpu-stack
REPOSITORY = f"{PROJECT}/gpu-stack-webhook"


@dataclass(frozen=True)
class Published:
    registry: Registry
    chart: str  # oci://<host>/gpu-stack/charts/gpu-stack
    digests: dict[str, str]  # version -> the digest the release's .digest file names
    pinned: dict[str, str]  # version -> the webhook.image.digest of the chart package publish rewrote
    served: dict[str, str]  # version -> the digest the registry serves (skopeo inspect, here)

    @property
    def image(self) -> str:
        return f"{self.registry.host}/{REPOSITORY}"


def package_digest(package: Path) -> str:
    with tarfile.open(package) as tar:
        member = tar.extractfile("gpu-stack/values.yaml")
        assert member is not None
        return str(yaml.safe_load(member.read())["webhook"]["image"]["digest"])


@pytest.fixture(scope="module")
def published(real_node: node.Node, cluster: E2ECluster, node_registry: Registry,
              tmp_path_factory: pytest.TempPathFactory) -> Published:
    where = tmp_path_factory.mktemp("registry-release")
    repo = make_checkout(where)
    # the image in buildah's storage when buildah built it (no import), else the archive any engine writes
    in_storage = subprocess.run(["buildah", "inspect", "--type", "image", IMAGE], capture_output=True, check=False)
    path, env = prebuilt_engine_path(where, IMAGE if in_storage.returncode == 0 else f"docker-archive:{IMAGE_ARCHIVE}")
    # `helm registry login`, as a user does before `make release-publish`; skopeo reads the same file
    env["HELM_REGISTRY_CONFIG"] = str(node_registry.login_helm(cluster.helm3_bin))
    started = time.monotonic()
    publishes = {}
    # each release is published while the next one is cut
    with ThreadPoolExecutor(2) as pool:
        for version in (PREVIOUS, NEW):
            if version == NEW:
                prepared = run_release(repo, path, "prepare", version)
                assert prepared.returncode == 0, prepared.stderr
                commit(repo, f"gpu-stack {version}")
            built = run_release(repo, path, "build", version, helm=cluster.helm3_bin, extra_env=env)
            subprocess.run(["buildah", "rmi", f"ghcr.io/{REPOSITORY}:{version}"], check=False, capture_output=True)
            assert built.returncode == 0, built.stdout + built.stderr
            publishes[version] = pool.submit(
                run_release, repo, path, "publish", version, "--registry", f"{node_registry.host}/{PROJECT}",
                "--ca-file", str(node_registry.ca_cert), helm=cluster.helm3_bin, extra_env=env)
    for publish in publishes.values():
        proc = publish.result()
        assert proc.returncode == 0, proc.stdout + proc.stderr
        print(proc.stdout.strip())
    print(f"releases cut and published in {time.monotonic() - started:.1f}s")
    dist = repo / "dist"
    return Published(
        node_registry, f"oci://{node_registry.host}/{PROJECT}/charts/gpu-stack",
        {v: (dist / v / f"gpu-stack-webhook-{v}.digest").read_text().strip() for v in (PREVIOUS, NEW)},
        {v: package_digest(dist / v / f"gpu-stack-{v}.tgz") for v in (PREVIOUS, NEW)},
        {v: node_registry.digest(REPOSITORY, v) for v in (PREVIOUS, NEW)})


def helm_from_registry(cluster: E2ECluster, published: Published, verb: str, release: Release, version: str,
                       *values: str, wait: str = "4m", check: bool = True) -> str:
    """`helm install|upgrade <release> oci://<registry>/gpu-stack/charts/gpu-stack --version <version>`: no image
    flag (the published chart names its image by digest), the pull secret and this machine's INSTALL_SET."""
    sets = list(values)
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


def test_the_release_pins_the_digest_the_registry_serves(published: Published) -> None:
    assert published.digests == published.served
    assert published.pinned == published.served
    assert published.served[PREVIOUS] != published.served[NEW]


def test_the_node_pulls_the_released_image_with_the_pull_secret(
        cluster: E2ECluster, published: Published, from_registry: Release, real_node: node.Node) -> None:
    pinned = f"{published.image}@{published.served[PREVIOUS]}"
    assert running_images(cluster, from_registry) == {(pinned, pinned)}
    pod = webhook_pods(cluster, from_registry)[0]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "registry-pull"}]
    pulled = cluster.get_json("events", "-n", from_registry.namespace, "--field-selector", "reason=Pulled")["items"]
    print("\n".join(e["message"] for e in pulled))  # the kubelet's "Successfully pulled image ... in <time>"
    listed = real_node.ctr("images", "ls", "-q").stdout.split()
    assert pinned in listed, listed  # pulled by digest through the registry, not imported


def test_an_upgrade_to_the_new_release_keeps_the_webhook_answering_and_rollback_restores_it(
        cluster: E2ECluster, published: Published, from_registry: Release) -> None:
    load_namespace = cluster.create_namespace(unique("load"))
    load = Admissions(cluster, load_namespace)
    with load.running():
        time.sleep(3)
        helm_from_registry(cluster, published, "upgrade", from_registry, NEW,
                           "webhook.imagePullSecrets[0].name=registry-pull")
        upgraded = running_images(cluster, from_registry)
        time.sleep(3)
    new = f"{published.image}@{published.served[NEW]}"
    assert upgraded == {(new, new)}
    assert set(load.verdicts("bad-gpu")) == {"denied"}, str(load)
    assert set(load.verdicts("good-gpu")) == {"admitted"}, str(load)
    assert set(load.verdicts("plain")) == {"admitted"}, str(load)

    cluster.helm("rollback", from_registry.name, "1", "-n", from_registry.namespace, "--wait", "--timeout", "4m",
                 timeout=300)
    previous = f"{published.image}@{published.served[PREVIOUS]}"
    assert running_images(cluster, from_registry) == {(previous, previous)}
    cluster.kubectl("delete", "namespace", load_namespace, "--wait=false")
