"""Self-managed TLS against the real API: `serve --tls-mode self-managed` with the API access of the
chart's webhook ServiceAccount (a TokenRequest token, the chart's RBAC), as the webhook pods run it."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from .e2elib import E2ECluster, LiveWebhook, Release, Releases


def token_kubeconfig(cluster: E2ECluster, namespace: str, service_account: str, path: Path) -> Path:
    """A kubeconfig that acts as the ServiceAccount, with a token from the TokenRequest API."""
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    token = cluster.kubectl("create", "token", service_account, "-n", namespace, "--duration=1h").stdout.strip()
    context = {"cluster": admin["clusters"][0]["name"], "user": service_account}
    config = {**admin, "users": [{"name": service_account, "user": {"token": token}}],
              "contexts": [{"name": "sa", "context": context}], "current-context": "sa"}
    path.write_text(yaml.safe_dump(config))
    return path


def secret(cluster: E2ECluster, release: Release) -> dict[str, Any]:
    obj = cluster.get_json("secret", f"{release.fullname}-webhook-tls", "-n", release.namespace)
    return {**obj, "decoded": {k: base64.b64decode(v) for k, v in obj["data"].items()}}


def served_certificate(port: int, ca_pem: bytes, hostname: str) -> bytes:
    """The certificate served on port, verified against ca_pem for the Service's DNS name."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=hostname) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM)


def ca_bundles(cluster: E2ECluster, release: Release) -> set[bytes]:
    return {base64.b64decode(hook["clientConfig"].get("caBundle", ""))
            for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
            for obj in cluster.get_json(kind, "-l", release.selector)["items"] for hook in obj["webhooks"]}


def test_self_managed_tls_lifecycle(cluster: E2ECluster, releases: Releases, tmp_path: Path) -> None:
    release, _ = releases.install()
    name = f"{release.fullname}-webhook"
    kubeconfig = token_kubeconfig(cluster, release.namespace, name, tmp_path / "sa.kubeconfig")
    hostname = f"{name}.{release.namespace}.svc"

    # Two replicas start at once and agree on one CA Secret.
    hooks = [LiveWebhook(cluster, tmp_path / f"replica-{i}") for i in range(2)]
    try:
        threads = [threading.Thread(target=h.start_self_managed, args=(release, kubeconfig)) for h in hooks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for h in hooks:
            assert h.process is not None and h.process.poll() is None, h.log()
        stored = secret(cluster, release)
        assert stored["type"] == "kubernetes.io/tls"
        assert stored["metadata"]["ownerReferences"][0]["kind"] == "ValidatingWebhookConfiguration"
        ca = stored["decoded"]["ca.crt"]
        for h in hooks:
            assert served_certificate(h.port, ca, hostname) == stored["decoded"]["tls.crt"]
        # The caBundle landed in both installed configurations.
        assert ca_bundles(cluster, release) == {ca}

        # A corrupted Secret is replaced (with an ERROR line saying what was wrong).
        cluster.kubectl("patch", "secret", f"{name}-tls", "-n", release.namespace, "--type=merge",
                        "-p", json.dumps({"data": {"ca.crt": base64.b64encode(b"garbage").decode()}}))
        third = LiveWebhook(cluster, tmp_path / "replica-2")
        hooks.append(third)
        third.start_self_managed(release, kubeconfig)
        replaced = secret(cluster, release)
        assert replaced["decoded"]["ca.crt"] != b"garbage"
        x509.load_pem_x509_certificates(replaced["decoded"]["ca.crt"])
        assert '"level":"ERROR"' in third.log() and "corrupted" in third.log(), third.log()
        assert served_certificate(third.port, replaced["decoded"]["ca.crt"], hostname) == replaced["decoded"]["tls.crt"]
        deadline = time.monotonic() + 30
        while ca_bundles(cluster, release) != {replaced["decoded"]["ca.crt"]}:
            assert time.monotonic() < deadline, "the new CA never reached the caBundle"
            time.sleep(0.5)
    finally:
        for h in hooks:
            h.stop()

    # After helm uninstall the garbage collector removes the Secret (owned by the configuration).
    releases.uninstall(release)
    deadline = time.monotonic() + 60
    while cluster.kubectl("get", "secret", f"{name}-tls", "-n", release.namespace, "--ignore-not-found",
                          "-o", "name").stdout:
        assert time.monotonic() < deadline, "the garbage collector left the webhook's Secret"
        time.sleep(1)


def test_rbac_denial_is_a_clear_error(cluster: E2ECluster, releases: Releases, tmp_path: Path) -> None:
    """The namespace's default ServiceAccount has none of the chart's RBAC: serve stops and says why."""
    release, _ = releases.install()
    kubeconfig = token_kubeconfig(cluster, release.namespace, "default", tmp_path / "default.kubeconfig")
    hook = LiveWebhook(cluster, tmp_path / "denied")
    name = f"{release.fullname}-webhook"
    (tmp_path / "denied").mkdir()
    proc = subprocess.run([*hook.command(), "serve", "--tls-mode", "self-managed", "--cert-dir", str(tmp_path / "tls"),
                           "--tls-secret", f"{name}-tls", "--namespace", release.namespace, "--service", name,
                           "--mutating-webhook-configuration", name, "--validating-webhook-configuration", name,
                           "--kubeconfig", str(kubeconfig), "--bind", "127.0.0.1:0"],
                          capture_output=True, text=True, env=hook.serve_env(), timeout=180, check=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("gpu-stack-webhook: self-managed TLS: cannot set up"), proc.stderr
    assert "403" in last or "forbidden" in last.lower(), last
    assert f"system:serviceaccount:{release.namespace}:default" in proc.stderr, proc.stderr


def test_rotation_with_a_shortened_lifetime(cluster: E2ECluster, releases: Releases, tmp_path: Path) -> None:
    """Serving certificates of 60 s, renewed with 50 s left, checked every second: the webhook serves a
    new certificate from the same CA without restarting, and the Secret follows."""
    release, _ = releases.install()
    name = f"{release.fullname}-webhook"
    kubeconfig = token_kubeconfig(cluster, release.namespace, name, tmp_path / "sa.kubeconfig")
    hook = LiveWebhook(cluster, tmp_path / "rotating")
    try:
        hook.start_self_managed(release, kubeconfig, ["--cert-validity", "60s", "--cert-renew-before", "50s",
                                                      "--tls-check-interval", "1s"])
        first = secret(cluster, release)["decoded"]
        hostname = f"{name}.{release.namespace}.svc"
        assert served_certificate(hook.port, first["ca.crt"], hostname) == first["tls.crt"]
        deadline = time.monotonic() + 90
        while (now := secret(cluster, release)["decoded"])["tls.crt"] == first["tls.crt"]:
            assert time.monotonic() < deadline, "the serving certificate was never renewed\n" + hook.log()
            time.sleep(1)
        assert now["ca.crt"] == first["ca.crt"]
        deadline = time.monotonic() + 30  # workers switch at the next TLS handshake once the files change
        while served_certificate(hook.port, now["ca.crt"], hostname) == first["tls.crt"]:
            assert time.monotonic() < deadline, "the new certificate is not served"
            time.sleep(0.5)
        assert hook.process is not None and hook.process.poll() is None  # no restart
    finally:
        hook.stop()
