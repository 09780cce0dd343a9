"""Self-managed TLS (`serve --tls-mode self-managed`, the chart's default) against the real API server, with
the webhook's own ServiceAccount: a token from the TokenRequest API (`kubectl create token`), the RBAC the
chart installs, nothing more. No nodes run the chart's Deployment, so its container runs here as the pod
would (gpu_stack_dev.e2e.podrun): the installed Deployment's command, args and env, its policy ConfigMap, TLS
emptyDir and /tmp mounted where the pod mounts them, the working tree read-only, the ServiceAccount token
where the kubelet puts it, as uid/gid 65532 without capabilities.

- Two replicas starting together agree on one CA; the caBundle lands in both configurations; the Secret is
  owned by the ValidatingWebhookConfiguration; what is served over TLS is the Secret's certificate.
- A corrupted Secret is repaired both ways: by running replicas in their renewal loop, and by a replica
  that starts on it (bootstrap, an ERROR log line saying what was wrong).
- The garbage collector removes the Secret after `helm uninstall`.
- The namespace's default ServiceAccount (none of the chart's RBAC): `serve` stops with a clear error.
- Short lifetimes: the serving certificate is renewed from the same CA and served without a restart, then
  the CA is rotated (in every caBundle before it signs)."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from gpu_stack_dev.e2e.e2elib import WEBHOOK_KINDS, E2ECluster, Release, Releases
from gpu_stack_dev.e2e.podrun import ChartContainer

STARTUP_SECONDS = 90


def sa_kubeconfig(cluster: E2ECluster, release: Release, path: Path, serviceaccount: str | None = None) -> Path:
    """A kubeconfig for the ServiceAccount: the admin kubeconfig's cluster, a TokenRequest token as user."""
    token = cluster.kubectl("create", "token", serviceaccount or f"{release.fullname}-webhook",
                            "-n", release.namespace, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    kubeconfig = {
        "apiVersion": "v1", "kind": "Config", "current-context": "webhook",
        "clusters": [next(c for c in admin["clusters"] if c["name"] == context["cluster"])],
        "users": [{"name": "webhook", "user": {"token": token}}],
        "contexts": [{"name": "webhook", "context": {"cluster": context["cluster"], "user": "webhook"}}],
    }
    path.write_text(yaml.safe_dump(kubeconfig))
    return path


@dataclass
class Serve:
    container: ChartContainer

    @property
    def process(self) -> subprocess.Popen[bytes]:
        assert self.container.process is not None
        return self.container.process

    @property
    def port(self) -> int:
        return self.container.port

    @property
    def cert_dir(self) -> Path:
        """The TLS emptyDir, where `--cert-dir` (as the chart sets it) points inside the container."""
        args = self.container.args()
        return self.container.host_path(args[args.index("--cert-dir") + 1])

    def log(self) -> str:
        return self.container.log()

    def serving_cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate((self.cert_dir / "tls.crt").read_bytes())

    def wait_ready(self) -> None:
        wait_for((self.cert_dir / "ready").exists, "self-managed TLS ready (ready-file)",
                 self.process, self.log)

    def served(self, bundle: bytes, hostname: str) -> x509.Certificate:
        """The certificate served on the port over TLS, verified against `bundle` for the Service's DNS name
        (what the API server checks); waits until gunicorn accepts connections."""
        context = ssl.create_default_context(cadata=bundle.decode())

        def handshake() -> x509.Certificate | None:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=10) as raw, \
                        context.wrap_socket(raw, server_hostname=hostname) as tls:
                    der = tls.getpeercert(binary_form=True)
            except ConnectionError:
                return None
            assert der is not None
            return x509.load_der_x509_certificate(der)

        result: x509.Certificate = wait_for(handshake, f"a TLS handshake on port {self.port}", self.process,
                                            self.log)
        return result

    def stop(self) -> None:
        self.container.stop()


def wait_for(condition: Callable[[], Any], what: str, process: subprocess.Popen[bytes] | None = None,
             log: Callable[[], str] = str, timeout: float = STARTUP_SECONDS) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        if process is not None and process.poll() is not None:
            raise AssertionError(f"serve exited ({process.returncode}) waiting for {what}:\n{log()}")
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}:\n{log()}")


def installed_deployment(cluster: E2ECluster, release: Release) -> dict[str, Any]:
    deployment: dict[str, Any] = cluster.get_json("deployment", f"{release.fullname}-webhook", "-n",
                                                  release.namespace)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "serve" and args[args.index("--tls-mode") + 1] == "self-managed"
    return deployment


@pytest.fixture
def serve(cluster: E2ECluster, release: Release, tmp_path: Path) -> Iterator[Callable[..., Serve]]:
    """Starts a replica of the installed webhook Deployment, with `extra` arguments after the chart's."""
    started: list[Serve] = []

    def start(*extra: str, serviceaccount: str | None = None) -> Serve:
        container = ChartContainer(cluster, installed_deployment(cluster, release), tmp_path / f"pod-{len(started)}",
                                   serviceaccount=serviceaccount, extra_args=extra)
        started.append(Serve(container.start()))
        return started[-1]

    yield start
    for s in started:
        s.stop()


def secret_data(cluster: E2ECluster, release: Release) -> dict[str, bytes] | None:
    proc = cluster.kubectl("get", "secret", f"{release.fullname}-webhook-tls", "-n", release.namespace, "-o", "json",
                           check=False)
    if proc.returncode:
        return None
    return {k: base64.b64decode(v) for k, v in json.loads(proc.stdout).get("data", {}).items()}


def ca_bundles(cluster: E2ECluster, release: Release) -> list[bytes]:
    """The caBundle of every webhook of the release's two configurations."""
    bundles = []
    for kind in WEBHOOK_KINDS:
        (config,) = cluster.get_json(kind, "-l", release.selector)["items"]
        bundles += [base64.b64decode(h["clientConfig"].get("caBundle", "")) for h in config["webhooks"]]
    return bundles


def cas(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem)


def signing_ca(data: dict[str, bytes]) -> x509.Certificate:
    """The CA whose key is ca.key (the first certificate of ca.crt, as the webhook writes it)."""
    return cas(data["ca.crt"])[0]


def issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except Exception:
        return False
    return True


def corrupt(cluster: E2ECluster, release: Release, key: str, junk: bytes) -> None:
    cluster.kubectl("patch", "secret", f"{release.fullname}-webhook-tls", "-n", release.namespace, "--type=merge",
                    "-p", json.dumps({"data": {key: base64.b64encode(junk).decode()}}))


@pytest.fixture
def release(releases: Releases) -> Release:
    installed, _ = releases.install()
    return installed


def test_two_replicas_agree_then_corruption_is_repaired_and_uninstall_collects_the_secret(
        cluster: E2ECluster, releases: Releases, release: Release, serve: Callable[..., Serve],
        tmp_path: Path) -> None:
    assert secret_data(cluster, release) is None  # the chart leaves the Secret to the webhook
    hostname = f"{release.fullname}-webhook.{release.namespace}.svc"
    args = ("--tls-check-interval", "2s")
    replicas = [serve(*args), serve(*args)]  # started together
    for replica in replicas:
        replica.wait_ready()
    data = secret_data(cluster, release)
    assert data is not None
    ca = signing_ca(data)
    assert len(cas(data["ca.crt"])) == 1  # one CA: the replica that lost the create race used the winner's
    assert all(issued_by(r.serving_cert(), ca) for r in replicas)
    for replica in replicas:  # what the API server would be served: the Secret's certificate, for the Service
        assert replica.served(data["ca.crt"], hostname) == x509.load_pem_x509_certificate(data["tls.crt"])
    assert ca_bundles(cluster, release) == [data["ca.crt"]] * 2  # mutate + validate webhooks
    names = replicas[0].serving_cert().extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert hostname in names.get_values_for_type(x509.DNSName)
    secret = cluster.get_json("secret", f"{release.fullname}-webhook-tls", "-n", release.namespace)
    assert secret["type"] == "kubernetes.io/tls"
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("ValidatingWebhookConfiguration", f"{release.fullname}-webhook")

    # Running replicas: a corrupted Secret (the CA key replaced by junk) is replaced on the next check, and
    # both configurations trust the new CA (the old, still valid one stays in the bundle so nothing in flight
    # breaks).
    corrupt(cluster, release, "ca.key", b"not a key")

    def repaired() -> dict[str, bytes] | None:
        now = secret_data(cluster, release)
        return now if now and now["ca.key"] != b"not a key" else None

    data = wait_for(repaired, "the corrupted Secret replaced", log=replicas[0].log)
    new_ca = signing_ca(data)
    assert new_ca.fingerprint(new_ca.signature_hash_algorithm) != ca.fingerprint(ca.signature_hash_algorithm)
    assert [c.subject for c in cas(data["ca.crt"])] == [new_ca.subject, ca.subject]
    wait_for(lambda: ca_bundles(cluster, release) == [data["ca.crt"]] * 2, "the new bundle in both configurations")
    for replica in replicas:
        wait_for(lambda r=replica: issued_by(r.serving_cert(), new_ca), "the serving pair re-issued",
                 log=replica.log)
    assert "is corrupted (ca.key is not an EC private key of any certificate in ca.crt); replacing it" in "".join(
        r.log() for r in replicas)
    for replica in replicas:  # stopped, as their Deployment would be
        replica.stop()

    # A replica starting on a corrupted Secret (ca.crt no certificate at all) repairs it before it serves,
    # with an ERROR line in the structured log saying what was wrong.
    corrupt(cluster, release, "ca.crt", b"garbage")
    third = serve(*args)
    third.wait_ready()
    data = secret_data(cluster, release)  # ready: the bootstrap reconcile has replaced it
    assert data is not None and data["ca.crt"] != b"garbage"
    assert len(cas(data["ca.crt"])) == 1  # nothing of the old bundle to keep
    assert '"level":"ERROR"' in third.log() and "is corrupted (ca.crt is missing or holds no PEM certificate)" in \
        third.log(), third.log()
    assert third.served(data["ca.crt"], hostname) == x509.load_pem_x509_certificate(data["tls.crt"])
    wait_for(lambda: ca_bundles(cluster, release) == [data["ca.crt"]] * 2, "the repaired bundle in both configurations")
    third.stop()

    # Uninstalled: the garbage collector removes the Secret, because its owner, the
    # ValidatingWebhookConfiguration, is gone.
    releases.uninstall(release)
    cluster.kubectl("wait", "--for=delete", f"secret/{release.fullname}-webhook-tls", "-n", release.namespace,
                    "--timeout=60s")


def test_rbac_denial_is_a_clear_error(cluster: E2ECluster, release: Release, serve: Callable[..., Serve]) -> None:
    """The namespace's default ServiceAccount has none of the chart's RBAC: serve stops and says why."""
    replica = serve(serviceaccount="default")
    assert replica.process.wait(180) != 0
    last = replica.log().strip().splitlines()[-1]
    assert last.startswith("gpu-stack-webhook: self-managed TLS: cannot set up"), replica.log()
    assert "403" in last or "forbidden" in last.lower(), last
    assert f"system:serviceaccount:{release.namespace}:default" in replica.log(), replica.log()
    assert secret_data(cluster, release) is None  # nothing written


def test_rotation_with_short_lifetimes(cluster: E2ECluster, release: Release, serve: Callable[..., Serve],
                                       tmp_path: Path) -> None:
    hostname = f"{release.fullname}-webhook.{release.namespace}.svc"
    # CA valid 60s, rotated when 45s are left (after ~15s), new CA trusted 3s before it signs; serving
    # certificates valid 30s, renewed 20s before they expire (after ~10s).
    replica = serve("--tls-check-interval", "1s", "--ca-validity", "60s", "--ca-renew-before", "45s",
                    "--ca-overlap", "3s", "--cert-validity", "30s", "--cert-renew-before", "20s")
    replica.wait_ready()
    first = secret_data(cluster, release)
    assert first is not None
    first_ca, first_serial = signing_ca(first), replica.serving_cert().serial_number
    assert replica.served(first["ca.crt"], hostname).serial_number == first_serial

    # The serving certificate is renewed first, by the same CA (the CA's rotation starts in the reconcile
    # that renews it at the latest, and a new CA signs only a reconcile after that); the Secret follows and
    # the running workers serve it at their next handshake: no restart.
    renewed = wait_for(lambda: (c := replica.serving_cert()).serial_number != first_serial and c,
                       "the serving certificate renewed", replica.process, replica.log, timeout=60)
    assert issued_by(renewed, first_ca)
    wait_for(lambda: (now := secret_data(cluster, release)) and now["tls.crt"] != first["tls.crt"],
             "the renewed certificate in the Secret", log=replica.log)

    def serving_renewed() -> bool:
        bundle = secret_data(cluster, release)
        return bundle is not None and replica.served(bundle["ca.crt"], hostname).serial_number != first_serial

    wait_for(serving_renewed, "the renewed certificate served", replica.process, replica.log, timeout=30)

    def promoted() -> dict[str, bytes] | None:
        now = secret_data(cluster, release)
        return now if now and signing_ca(now) != first_ca else None

    rotated = wait_for(promoted, "the CA rotated", log=replica.log, timeout=90)
    new_ca = signing_ca(rotated)
    # Trusted by the API server before it signs: at promotion the caBundle already holds the new CA
    for bundle in ca_bundles(cluster, release):
        assert new_ca in cas(bundle)
    wait_for(lambda: issued_by(replica.serving_cert(), new_ca), "a serving certificate from the new CA",
             log=replica.log)
    log = replica.log()
    assert "a new CA joins the bundle" in log
    assert "the new CA is in every caBundle: it now signs the serving certificate" in log
    assert replica.process.poll() is None  # never restarted
