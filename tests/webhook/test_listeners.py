"""One listening socket per worker only where a second SO_REUSEPORT bind works (server/listeners.py).

gVisor's netstack refuses the second bind with EADDRINUSE; gunicorn 27 then lets each worker bind in the
child (arbiter.py `spawn_worker`), and a worker that cannot bind exits and is forked again, forever. Here the
refusal is simulated: in-process for the decision, and in a real `gpu-stack-webhook serve` with two workers
through a sitecustomize that makes every second SO_REUSEPORT bind of a port fail as gVisor's does.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from gpu_stack_webhook.server import listeners
from gpu_stack_webhook.server.gunicorn_conf import ServeOptions, settings
from gpu_stack_webhook.tls.certs import write_loopback_pki

# Loaded by the serve process through PYTHONPATH: the second SO_REUSEPORT bind of any port fails, as in gVisor.
REFUSING_SITECUSTOMIZE = '''
import errno, socket
_bound = set()
_bind = socket.socket.bind
def bind(self, address):
    reuse = self.family in (socket.AF_INET, socket.AF_INET6) and self.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
    if reuse and address[1] and (address[0], address[1]) in _bound:
        raise OSError(errno.EADDRINUSE, "Address already in use")
    _bind(self, address)
    if reuse:
        _bound.add((address[0], self.getsockname()[1]))
socket.socket.bind = bind
'''


def refuse_second_reuseport_bind(monkeypatch: pytest.MonkeyPatch) -> None:
    bound: set[int] = set()
    real_bind = socket.socket.bind

    def bind(self: socket.socket, address: tuple[str, int]) -> None:
        if self.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) and address[1] in bound:
            raise OSError(errno.EADDRINUSE, "Address already in use")
        real_bind(self, address)
        bound.add(self.getsockname()[1])

    monkeypatch.setattr(socket.socket, "bind", bind)


def test_a_kernel_that_shares_ports_gets_one_listener_per_worker() -> None:
    assert listeners.reuse_port_works("127.0.0.1:8443") is True
    assert settings(ServeOptions(bind="127.0.0.1:8443", certfile="c", keyfile="k"))["reuse_port"] is True


def test_a_refused_second_bind_falls_back_to_one_shared_listener_with_one_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    refuse_second_reuseport_bind(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="gpu_stack_webhook.server"):
        conf = settings(ServeOptions(bind="0.0.0.0:8443", certfile="c", keyfile="k"))
    assert conf["reuse_port"] is False
    assert [r.getMessage() for r in caplog.records] == [
        "SO_REUSEPORT: a second bind of one port is refused here (EADDRINUSE); the workers share one listening socket"]


def test_unix_sockets_never_ask_for_reuse_port() -> None:
    assert listeners.reuse_port_works("unix:/tmp/webhook.sock") is False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_serve_with_two_workers_where_reuse_port_is_refused_keeps_both_workers_up(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(REFUSING_SITECUSTOMIZE)
    pki = write_loopback_pki(tmp_path / "pki")
    (tmp_path / "policy.yaml").write_text("{}\n")
    port = _free_port()
    script = Path(sys.executable).with_name("gpu-stack-webhook")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "GPU_STACK_WEBHOOK_WORKERS": "2",
           "GPU_STACK_WEBHOOK_THREADS": "2"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([str(script), "serve", "--config", str(tmp_path / "policy.yaml"),
                                 "--cert", str(pki.cert), "--key", str(pki.key), "--bind", f"127.0.0.1:{port}"],
                                stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        context = ssl.create_default_context(cafile=str(pki.ca_cert))
        answered = 0
        deadline = time.monotonic() + 60
        while answered < 20 and time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=context, timeout=5) as r:
                    answered += r.status == 200
            except OSError:
                time.sleep(0.2)
        time.sleep(2)  # time for a worker that could not bind to exit and be forked again
        log = log_path.read_text()
        assert answered == 20, log
        assert proc.poll() is None, log
        assert "Connection in use" not in log
        assert log.count("Booting worker with pid") == 2, log
        assert log.count("SO_REUSEPORT: a second bind of one port is refused here") == 1, log
    finally:
        proc.terminate()
        proc.wait(30)
