"""Self-managed TLS (`serve --tls-mode self-managed`, the chart's default) against the real API server, with
the webhook's own ServiceAccount: a token from the TokenRequest API (`kubectl create token`), the RBAC the
chart installs, nothing more. No nodes run the chart's Deployment, so the `serve` processes run here, with
the arguments the chart gives the container (read from the installed Deployment).

tests/e2e/test_selfmanaged_tls.py covers the bootstrap path (a replica starting on a corrupted Secret) and
an RBAC denial; this file covers running replicas: the renewal thread repairing a corrupted Secret,
CA rotation with short lifetimes, and the garbage collector after uninstall."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from .e2elib import WEBHOOK_KINDS, E2ECluster, Release, Releases, controlplane

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


def chart_serve_args(cluster: E2ECluster, release: Release) -> list[str]:
    """The container's `serve` arguments from the installed Deployment, minus what only makes sense in the pod."""
    deployment = cluster.get_json("deployment", f"{release.fullname}-webhook", "-n", release.namespace)
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "serve" and "--tls-mode" in args and args[args.index("--tls-mode") + 1] == "self-managed"
    drop = {"--config", "--cert-dir", "--bind"}  # pod paths and port: ours are set per process
    out: list[str] = []
    skip = False
    for arg in args[1:]:
        if skip:
            skip = False
        elif arg in drop:
            skip = True
        else:
            out.append(arg)
    return out


@dataclass
class Serve:
    process: subprocess.Popen[bytes]
    cert_dir: Path
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def serving_cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate((self.cert_dir / "tls.crt").read_bytes())

    def wait_ready(self) -> None:
        wait_for((self.cert_dir / "ready").exists, "self-managed TLS ready (ready-file)",
                 self.process, self.log)


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


@pytest.fixture
def serve(cluster: E2ECluster, tmp_path: Path) -> Iterator[Callable[..., Serve]]:
    started: list[Serve] = []
    script = Path(sys.executable).with_name("gpu-stack-webhook")
    command = str(script) if script.exists() else shutil.which("gpu-stack-webhook") or "gpu-stack-webhook"

    def start(args: list[str], kubeconfig: Path) -> Serve:
        workdir = tmp_path / f"serve-{len(started)}"
        workdir.mkdir()
        (workdir / "policy.yaml").write_text("{}\n")
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "PROMETHEUS_MULTIPROC_DIR")}
        env |= {"GPU_STACK_WEBHOOK_WORKERS": "1", "GPU_STACK_WEBHOOK_THREADS": "2"}
        log_path = workdir / "serve.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [command, "serve", *args, "--kubeconfig", str(kubeconfig), "--config", str(workdir / "policy.yaml"),
                 "--cert-dir", str(workdir / "tls"), "--bind", f"127.0.0.1:{controlplane.free_port()}"],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir, start_new_session=True)
        started.append(Serve(process, workdir / "tls", log_path))
        return started[-1]

    yield start
    for s in started:
        if s.process.poll() is None:
            s.process.send_signal(signal.SIGINT)  # gunicorn's quick shutdown
            try:
                s.process.wait(30)
            except subprocess.TimeoutExpired:
                s.process.kill()
                s.process.wait()


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


@pytest.fixture
def release(releases: Releases) -> Release:
    installed, _ = releases.install()
    return installed


def test_two_replicas_agree_then_corruption_is_repaired_and_uninstall_collects_the_secret(
        cluster: E2ECluster, releases: Releases, release: Release, serve: Callable[..., Serve],
        tmp_path: Path) -> None:
    assert secret_data(cluster, release) is None  # the chart leaves the Secret to the webhook
    kubeconfig = sa_kubeconfig(cluster, release, tmp_path / "sa.kubeconfig")
    args = [*chart_serve_args(cluster, release), "--tls-check-interval", "2s"]
    replicas = [serve(args, kubeconfig), serve(args, kubeconfig)]  # started together
    for replica in replicas:
        replica.wait_ready()
    data = secret_data(cluster, release)
    assert data is not None
    ca = signing_ca(data)
    assert len(cas(data["ca.crt"])) == 1  # one CA: the replica that lost the create race used the winner's
    assert all(issued_by(r.serving_cert(), ca) for r in replicas)
    assert ca_bundles(cluster, release) == [data["ca.crt"]] * 2  # mutate + validate webhooks
    names = replicas[0].serving_cert().extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{release.fullname}-webhook.{release.namespace}.svc" in names.get_values_for_type(x509.DNSName)
    secret = cluster.get_json("secret", f"{release.fullname}-webhook-tls", "-n", release.namespace)
    assert secret["type"] == "kubernetes.io/tls"
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("ValidatingWebhookConfiguration", f"{release.fullname}-webhook")

    # A corrupted Secret (the CA key replaced by junk) is replaced on the next check, and both configurations
    # trust the new CA (the old, still valid one stays in the bundle so nothing in flight breaks).
    cluster.kubectl("patch", "secret", f"{release.fullname}-webhook-tls", "-n", release.namespace, "--type=merge",
                    "-p", json.dumps({"data": {"ca.key": base64.b64encode(b"not a key").decode()}}))

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

    # Uninstalled (the replicas stopped first, as their Deployment would be): the garbage collector removes the
    # Secret, because its owner, the ValidatingWebhookConfiguration, is gone.
    for replica in replicas:
        replica.process.send_signal(signal.SIGINT)
        replica.process.wait(30)
    releases.uninstall(release)
    cluster.kubectl("wait", "--for=delete", f"secret/{release.fullname}-webhook-tls", "-n", release.namespace,
                    "--timeout=60s")


def test_rotation_with_short_lifetimes(cluster: E2ECluster, release: Release, serve: Callable[..., Serve],
                                       tmp_path: Path) -> None:
    kubeconfig = sa_kubeconfig(cluster, release, tmp_path / "sa.kubeconfig")
    # CA valid 60s, rotated when 45s are left (after ~15s), new CA trusted 3s before it signs; serving
    # certificates valid 30s, renewed 20s before they expire.
    args = [*chart_serve_args(cluster, release), "--tls-check-interval", "1s", "--ca-validity", "60s",
            "--ca-renew-before", "45s", "--ca-overlap", "3s", "--cert-validity", "30s", "--cert-renew-before", "20s"]
    replica = serve(args, kubeconfig)
    replica.wait_ready()
    first = secret_data(cluster, release)
    assert first is not None
    first_ca, first_serial = signing_ca(first), replica.serving_cert().serial_number
    wait_for(lambda: replica.serving_cert().serial_number != first_serial, "the serving certificate renewed",
             log=replica.log, timeout=60)

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

