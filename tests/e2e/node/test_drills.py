"""Failure drills on the real node, each asserting what users see while pods are created continuously:
one webhook pod deleted, the webhook scaled to 0, a `helm upgrade` that rolls the pods, the CA Secret deleted,
and a fresh install whose two replicas start together.

The load is dry-run creates (`dryRun=All`: admission runs in full, nothing is stored) of three pods from
two threads: a GPU pod that sets NVIDIA_VISIBLE_DEVICES (GPU002 must refuse it, always), a clean GPU pod, and
a pod without GPUs (the matchConditions keep it away from the webhook: it must always be admitted).
"""

from __future__ import annotations

import base64
import contextlib
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from gpu_stack_dev.e2e.e2elib import WEBHOOK_KINDS, E2ECluster, Release, Releases, unique
from gpu_stack_dev.e2e.node_install import install_values, webhook_pods

from .conftest import install_and_wait

BAD_GPU = {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}},
           "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
GOOD_GPU = {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
PLAIN = {"name": "main", "image": "busybox"}
KINDS = {"bad-gpu": BAD_GPU, "good-gpu": GOOD_GPU, "plain": PLAIN}


@dataclass
class Admissions:
    """Continuous dry-run creates of the three kinds; each answer recorded as (kind, verdict, message)."""

    cluster: E2ECluster
    namespace: str
    results: list[tuple[str, str, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def _loop(self) -> None:
        from kubernetes import client  # noqa: PLC0415

        api = client.CoreV1Api(self.cluster.kubernetes)
        while not self.stop.is_set():
            for kind, container in KINDS.items():
                body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": f"{kind}-"},
                        "spec": {"containers": [container]}}
                try:
                    # the reply is not deserialised: only whether and how the API server refused matters
                    api.create_namespaced_pod(self.namespace, body, dry_run="All", _request_timeout=30,
                                              _preload_content=False)
                    self.results.append((kind, "admitted", ""))
                except client.ApiException as exc:
                    self.results.append((kind, "denied" if exc.status == 403 else f"error {exc.status}",
                                         str(exc.body)))
                except Exception as exc:  # a client-side failure is a result too
                    self.results.append((kind, f"client error {type(exc).__name__}", str(exc)))

    @contextlib.contextmanager
    def running(self) -> Iterator[Admissions]:
        threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(2)]
        for thread in threads:
            thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(60)

    def __str__(self) -> str:
        counts = Counter((k, v) for k, v, _ in self.results)
        first = {(k, v): m for k, v, m in reversed(self.results)}
        return "\n".join(f"{k} {v}: {n}  e.g. {first[(k, v)][:300]}" for (k, v), n in sorted(counts.items()))

    def verdicts(self, kind: str) -> Counter[str]:
        return Counter(verdict for k, verdict, _ in self.results if k == kind)

    def messages(self, kind: str, verdict: str) -> list[str]:
        return [m for k, v, m in self.results if k == kind and v == verdict]


@pytest.fixture(scope="module")
def drill_release(cluster: E2ECluster) -> Iterator[Release]:
    """A fresh install of its own (the drills change it), with the defaults."""
    helper = Releases(cluster)
    try:
        yield install_and_wait(helper, name="drills", namespace=unique("drills"))
    finally:
        helper.cleanup()


@pytest.fixture
def load_namespace(cluster: E2ECluster) -> str:
    return cluster.create_namespace(unique("load"))


def wait_ready_replicas(cluster: E2ECluster, release: Release, want: int = 2, timeout: float = 240) -> None:
    deployment = f"deployment/{release.fullname}-webhook"
    cluster.kubectl("rollout", "status", deployment, "-n", release.namespace, f"--timeout={int(timeout)}s",
                    timeout=timeout + 10)
    pods = [p for p in webhook_pods(cluster, release) if not p["metadata"].get("deletionTimestamp")]
    assert len(pods) == want


def secret_ca(cluster: E2ECluster, release: Release) -> bytes:
    secret = cluster.get_json("secret", f"{release.fullname}-webhook-tls", "-n", release.namespace)
    return base64.b64decode(secret["data"]["ca.crt"])


def ca_bundles(cluster: E2ECluster, release: Release) -> set[bytes]:
    return {base64.b64decode(hook["clientConfig"]["caBundle"])
            for kind in WEBHOOK_KINDS for config in cluster.get_json(kind, "-l", release.selector)["items"]
            for hook in config["webhooks"]}


def served_by_each_pod_verifies(cluster: E2ECluster, release: Release, ca: bytes) -> list[str]:
    """Each webhook pod's own certificate, fetched from its IP, verified against `ca` for the Service name."""
    context = ssl.create_default_context(cadata=ca.decode())
    host = f"{release.fullname}-webhook.{release.namespace}.svc"
    verified = []
    for pod in webhook_pods(cluster, release):
        with socket.create_connection((pod["status"]["podIP"], 8443), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname=host):
            verified.append(pod["metadata"]["name"])
    return verified


def test_a_fresh_install_starts_both_replicas_on_one_ca(cluster: E2ECluster, drill_release: Release) -> None:
    ca = secret_ca(cluster, drill_release)
    assert ca_bundles(cluster, drill_release) == {ca}
    assert len(served_by_each_pod_verifies(cluster, drill_release, ca)) == 2


def test_deleting_one_webhook_pod_under_load_admits_no_gpu_pod_unchecked(
        cluster: E2ECluster, drill_release: Release, load_namespace: str) -> None:
    load = Admissions(cluster, load_namespace)
    with load.running():
        time.sleep(3)
        victim = webhook_pods(cluster, drill_release)[0]["metadata"]["name"]
        cluster.kubectl("delete", "pod", victim, "-n", drill_release.namespace, "--wait=false")
        wait_ready_replicas(cluster, drill_release)
        time.sleep(3)
    assert load.verdicts("bad-gpu")["admitted"] == 0, str(load)
    assert set(load.verdicts("plain")) == {"admitted"}, str(load)
    assert load.verdicts("bad-gpu")["denied"] > 0, str(load)


def test_with_the_webhook_scaled_to_zero_gpu_pods_are_refused_naming_it(
        cluster: E2ECluster, drill_release: Release, load_namespace: str) -> None:
    deployment = f"deployment/{drill_release.fullname}-webhook"
    cluster.kubectl("scale", deployment, "-n", drill_release.namespace, "--replicas=0")
    try:
        cluster.kubectl("wait", "--for=delete", "pod", "-n", drill_release.namespace, "-l",
                        f"{drill_release.selector},app.kubernetes.io/component=webhook", "--timeout=120s")
        load = Admissions(cluster, load_namespace)
        with load.running():
            time.sleep(5)
        assert set(load.verdicts("plain")) == {"admitted"}, str(load)
        for kind in ("bad-gpu", "good-gpu"):
            assert set(load.verdicts(kind)) == {"error 500"}, str(load)
            message = load.messages(kind, "error 500")[0]
            assert 'failed calling webhook \\"mutate.gpu-stack.io\\"' in message, message
            assert f'no endpoints available for service \\"{drill_release.fullname}-webhook\\"' in message, message
    finally:
        cluster.kubectl("scale", deployment, "-n", drill_release.namespace, "--replicas=2")
        wait_ready_replicas(cluster, drill_release)


def test_an_upgrade_that_rolls_the_pods_fails_no_admission(
        cluster: E2ECluster, drill_release: Release, load_namespace: str) -> None:
    before = {p["metadata"]["name"] for p in webhook_pods(cluster, drill_release)}
    load = Admissions(cluster, load_namespace)
    with load.running():
        time.sleep(3)
        Releases(cluster).upgrade(drill_release, set_json=install_values(
            **{"webhook.podAnnotations": {"gpu-stack.io/drill": "rolled"}}), extra=["--wait", "--timeout", "4m"])
        wait_ready_replicas(cluster, drill_release)
        time.sleep(3)
    after = {p["metadata"]["name"] for p in webhook_pods(cluster, drill_release)
             if not p["metadata"].get("deletionTimestamp")}
    assert not before & after, "the upgrade did not replace the pods"
    assert set(load.verdicts("bad-gpu")) == {"denied"}, str(load)
    assert set(load.verdicts("good-gpu")) == {"admitted"}, str(load)
    assert set(load.verdicts("plain")) == {"admitted"}, str(load)
    assert all("GPU002" in m for m in load.messages("bad-gpu", "denied"))


def test_a_deleted_ca_secret_is_made_again_and_the_ca_bundles_follow(
        cluster: E2ECluster, drill_release: Release, load_namespace: str) -> None:
    old = secret_ca(cluster, drill_release)
    cluster.kubectl("delete", "secret", f"{drill_release.fullname}-webhook-tls", "-n", drill_release.namespace)
    deadline = time.monotonic() + 120
    while True:
        with contextlib.suppress(AssertionError):
            new = secret_ca(cluster, drill_release)
            if new != old and ca_bundles(cluster, drill_release) == {new}:
                with contextlib.suppress(OSError):
                    if len(served_by_each_pod_verifies(cluster, drill_release, new)) == 2:
                        break
        assert time.monotonic() < deadline, "the pods did not repair the CA Secret and caBundles in 120 s"
        time.sleep(1)
    load = Admissions(cluster, load_namespace)
    with load.running():
        time.sleep(3)
    assert set(load.verdicts("bad-gpu")) == {"denied"}, str(load)
    assert set(load.verdicts("good-gpu")) == {"admitted"}, str(load)
