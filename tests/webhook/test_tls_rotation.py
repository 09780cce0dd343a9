"""Self-managed TLS end to end: a real `gpu-stack-webhook serve --tls-mode self-managed` (gunicorn, 2
workers) against a fake apiserver over HTTPS (kube_fake.py, reached through a kubeconfig). Certificates
live seconds here, so the master's renewal thread rotates the serving certificate while a client keeps
ONE TLS connection open and keeps sending reviews: no request fails, and a new connection sees the new
certificate. Bounded loops, no timing assertions."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from gpu_stack_webhook.kube.client import VALIDATING
from gpu_stack_webhook.tls.config import CA_CRT, TLS_CRT

from .kube_fake import FakeKube, fake_apiserver, kubeconfig, standard_fake
from .podlib import container, make_pod, review
from .tls_helpers import STARTUP_SECONDS, Pki, cli_command, free_port, make_pki

NS, SECRET, SVC, CONFIG = "gpu-stack", "t-gpu-stack-webhook-tls", "t-gpu-stack-webhook", "t-gpu-stack-webhook"
SNI = f"{SVC}.{NS}.svc"


class SvcConnection(http.client.HTTPSConnection):
    """HTTPS to 127.0.0.1 verified as the in-cluster Service name (what the apiserver checks)."""

    def __init__(self, port: int, context: ssl.SSLContext) -> None:
        super().__init__("127.0.0.1", port, context=context, timeout=30)
        self.tls_context = context
        self.connects = 0

    def connect(self) -> None:
        self.connects += 1
        raw = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self.tls_context.wrap_socket(raw, server_hostname=SNI)

    def peer_serial(self) -> int:
        assert self.sock is not None
        der = self.sock.getpeercert(binary_form=True)  # type: ignore[attr-defined]
        return x509.load_der_x509_certificate(der).serial_number


@dataclass
class Webhook:
    process: subprocess.Popen[bytes]
    port: int
    fake: FakeKube
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def client_context(self) -> ssl.SSLContext:
        bundle = self.fake.secrets[(NS, SECRET)].data[CA_CRT]
        context = ssl.create_default_context(cadata=bundle.decode())
        return context


def _start(workdir: Path, fake: FakeKube, url: str, pki: Pki) -> Webhook:
    config = workdir / "kubeconfig"
    config.write_text(yaml.safe_dump(kubeconfig(url, pki)), encoding="utf-8")
    policy = workdir / "policy.yaml"
    policy.write_text("{}\n", encoding="utf-8")
    port = free_port()
    log_path = workdir / "server.log"
    env = {k: v for k, v in os.environ.items() if k not in ("PROMETHEUS_MULTIPROC_DIR", "GPU_STACK_WEBHOOK_CONFIG")}
    env.update({"TMPDIR": str(workdir), "GPU_STACK_WEBHOOK_WORKERS": "2", "GPU_STACK_WEBHOOK_THREADS": "2"})
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*cli_command(), "serve", "--config", str(policy), "--bind", f"127.0.0.1:{port}",
             "--tls-mode", "self-managed", "--kubeconfig", str(config), "--cert-dir", str(workdir / "tls"),
             "--tls-secret", SECRET, "--namespace", NS, "--service", SVC,
             "--mutating-webhook-configuration", CONFIG, "--validating-webhook-configuration", CONFIG,
             # seconds-long certificates: renewed once less than 57 of their 60 s are left
             "--cert-validity", "60s", "--cert-renew-before", "57s", "--tls-check-interval", "1s"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir)
    return Webhook(process, port, fake, log_path)


def _stop(webhook: Webhook) -> None:
    if webhook.process.poll() is None:
        webhook.process.terminate()
        try:
            webhook.process.wait(30)
        except subprocess.TimeoutExpired:
            webhook.process.kill()
            webhook.process.wait(30)


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    workdir = tmp_path_factory.mktemp("self-managed")
    pki = make_pki(workdir / "apiserver-pki")
    fake = standard_fake(NS, CONFIG, CONFIG)
    with fake_apiserver(fake, pki) as url:
        server = _start(workdir, fake, url, pki)
        try:
            deadline = time.monotonic() + STARTUP_SECONDS
            while time.monotonic() < deadline:  # bounded: until /readyz says ready
                if server.process.poll() is not None:
                    pytest.fail(f"serve exited with {server.process.returncode}:\n{server.log()}")
                if (NS, SECRET) in fake.secrets:
                    try:
                        conn = SvcConnection(server.port, server.client_context())
                        conn.request("GET", "/readyz")
                        if conn.getresponse().status == 200:
                            conn.close()
                            break
                        conn.close()
                    except (OSError, http.client.HTTPException):
                        pass
                time.sleep(0.2)
            else:
                pytest.fail(f"never ready:\n{server.log()}")
            yield server
        finally:
            _stop(server)


def _review_once(conn: SvcConnection, n: int) -> None:
    pod = make_pod([container("main", gpu=1)], name=f"pod-{n}")
    conn.request("POST", "/validate", body=json.dumps(review(pod)), headers={"Content-Type": "application/json"})
    reply = conn.getresponse()
    body = reply.read()
    assert reply.status == 200, body
    assert json.loads(body)["response"]["allowed"] is True


def test_the_webhook_set_up_its_secret_and_ca_bundle(webhook: Webhook) -> None:
    secret = webhook.fake.secrets[(NS, SECRET)]
    assert secret.type == "kubernetes.io/tls"
    assert secret.owner_references[0]["kind"] == VALIDATING and secret.owner_references[0]["name"] == CONFIG
    for config in webhook.fake.configs.values():
        assert set(config.ca_bundles.values()) == {secret.data[CA_CRT]}
    assert "created Secret gpu-stack/t-gpu-stack-webhook-tls with a new CA" in webhook.log()


def test_rotation_keeps_an_open_connection_and_serves_the_new_certificate_on_new_ones(webhook: Webhook) -> None:
    context = webhook.client_context()
    kept = SvcConnection(webhook.port, context)
    _review_once(kept, 0)
    first_serial = kept.peer_serial()
    failures: list[str] = []
    new_serial = None
    sent = 1
    for i in range(300):  # bounded: a renewal happens every few seconds
        try:
            _review_once(kept, sent)
            sent += 1
        except Exception as exc:
            failures.append(f"review {sent}: {type(exc).__name__}: {exc}")
        fresh = SvcConnection(webhook.port, context)
        try:
            fresh.request("GET", "/healthz")
            assert fresh.getresponse().read()
            serial = fresh.peer_serial()
        finally:
            fresh.close()
        if serial != first_serial:
            new_serial = serial
            break
        time.sleep(0.2 if i < 299 else 0)
    assert new_serial is not None, f"no renewed certificate seen:\n{webhook.log()}"
    for _ in range(5):  # the old connection keeps working after the switch
        _review_once(kept, sent)
        sent += 1
    assert failures == []
    assert kept.connects == 1 and kept.peer_serial() == first_serial  # one TLS connection all along
    kept.close()
    stored = x509.load_pem_x509_certificate(webhook.fake.secrets[(NS, SECRET)].data[TLS_CRT])
    assert stored.serial_number != first_serial
    assert "TLS certificate reloaded from" in webhook.log()
