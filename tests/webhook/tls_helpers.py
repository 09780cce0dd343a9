"""Throwaway TLS material and a real `gpu-stack-webhook serve` (gunicorn over TLS) for the HTTP tests.

- `make_pki(dir)`: a CA and an ECDSA P-256 serving certificate for 127.0.0.1 / localhost.
- `running_server(dir, policy=...)`: starts `gpu-stack-webhook serve` on a free port as a subprocess,
  waits for /healthz, yields a `Server` with a TLS client, stops it with SIGTERM.
- `Client`: http.client over TLS that counts the TCP connections it opens (keep-alive tests).
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import http.server
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from gpu_stack_webhook.tls.certs import PkiFiles, write_loopback_pki

# Generous: two gunicorn workers importing the webhook, and with --cluster-lookups their first reads, took
# over 60 s once at a load average of 27 (seven suites on 2 cores). Only a wait, never a verdict on speed.
STARTUP_SECONDS = 180
STOP_SECONDS = 30


# --------------------------------------------------------------------------------------------------
# PKI
# --------------------------------------------------------------------------------------------------


Pki = PkiFiles


def make_pki(directory: Path) -> Pki:
    """A CA (ECDSA P-256) and a serving certificate it signs, SAN 127.0.0.1 + localhost, valid a day."""
    return write_loopback_pki(directory, valid_for=datetime.timedelta(days=1))


def client_context(pki: Pki, *, maximum: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    """A client context that trusts only the test CA (hostname checked against the SAN)."""
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    if maximum is not None:
        context.maximum_version = maximum
    return context


def tls11_client_context(pki: Pki, version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_1) -> ssl.SSLContext:
    """A client that offers only `version`, TLS 1.1 or older (security level 0 so OpenSSL still allows it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_verify_locations(str(pki.ca_cert))
        context.set_ciphers("DEFAULT:@SECLEVEL=0")
        context.minimum_version = version
        context.maximum_version = version
    return context


def client_speaks_tls11(pki: Pki, version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_1) -> bool:
    """Whether this OpenSSL can complete a `version` handshake at all (against a local server that
    allows it): without that, a refused handshake would prove nothing about our server."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            server_ctx.load_cert_chain(str(pki.cert), str(pki.key))
            server_ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
            server_ctx.minimum_version = ssl.TLSVersion.TLSv1
            client_ctx = tls11_client_context(pki, version)
        except (ssl.SSLError, ValueError):
            return False
    listener = socket.create_server(("127.0.0.1", 0))
    result: dict[str, Any] = {}

    def accept() -> None:
        conn, _ = listener.accept()
        with contextlib.suppress(OSError), server_ctx.wrap_socket(conn, server_side=True) as tls:
            result["server"] = tls.version()
        conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        with (
            socket.create_connection(listener.getsockname(), timeout=10) as raw,
            client_ctx.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            return tls.version() == {ssl.TLSVersion.TLSv1: "TLSv1", ssl.TLSVersion.TLSv1_1: "TLSv1.1"}[version]
    except OSError:
        return False
    finally:
        thread.join(10)
        listener.close()


# --------------------------------------------------------------------------------------------------
# Client
# --------------------------------------------------------------------------------------------------


class CountingHTTPSConnection(http.client.HTTPSConnection):
    """HTTPSConnection that counts the TCP+TLS connections it establishes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connects = 0

    def connect(self) -> None:
        self.connects += 1
        super().connect()


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "")


@dataclass
class Client:
    host: str
    port: int
    context: ssl.SSLContext
    connection: CountingHTTPSConnection = field(init=False)

    def __post_init__(self) -> None:
        self.connection = self.new_connection()

    def new_connection(self) -> CountingHTTPSConnection:
        return CountingHTTPSConnection(self.host, self.port, context=self.context, timeout=30)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | str | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        connection: CountingHTTPSConnection | None = None,
        chunked: bool = False,
    ) -> Reply:
        conn = connection or self.connection
        data: Any = body.encode() if isinstance(body, str) else body
        if chunked and data is not None:
            payload = data
            data = (payload[i : i + 4096] for i in range(0, len(payload), 4096))
        conn.request(method, path, body=data, headers=dict(headers or {}), encode_chunked=chunked)
        response = conn.getresponse()
        return Reply(response.status, response.headers, response.read())

    def post_json(self, path: str, body: Any, **kwargs: Any) -> Reply:
        raw = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return self.request("POST", path, raw, {"Content-Type": "application/json"}, **kwargs)

    def get(self, path: str, **kwargs: Any) -> Reply:
        return self.request("GET", path, **kwargs)

    def close(self) -> None:
        self.connection.close()


# --------------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cli_command() -> list[str]:
    """The installed console script next to this interpreter, else the module."""
    script = Path(sys.executable).with_name("gpu-stack-webhook")
    if script.is_file():
        return [str(script)]
    found = shutil.which("gpu-stack-webhook")
    return [found] if found else [sys.executable, "-m", "gpu_stack_webhook.cli.main"]


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    pki: Pki
    workdir: Path
    log_path: Path

    def client(self, **context_kw: Any) -> Client:
        return Client("127.0.0.1", self.port, client_context(self.pki, **context_kw))

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_records(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far (other lines are ignored)."""
        records = []
        for line in self.log().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    records.append(record)
        return records


def _serve_args(pki: Pki, config: Path, port: int, extra: list[str]) -> list[str]:
    return [
        *cli_command(), "serve",
        "--config", str(config),
        "--cert", str(pki.cert),
        "--key", str(pki.key),
        "--bind", f"127.0.0.1:{port}",
        *extra,
    ]


def _wait_healthy(server: Server) -> bool:
    """True once /healthz answers; False when the process exited first (e.g. the port was taken)."""
    deadline = time.monotonic() + STARTUP_SECONDS
    context = client_context(server.pki)
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return False
        try:
            conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=5)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                conn.close()
                return True
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"gpu-stack-webhook did not become healthy in {STARTUP_SECONDS}s:\n{server.log()}")


def stop(server: Server) -> int:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(STOP_SECONDS)
    return server.process.returncode


@contextlib.contextmanager
def running_server(
    workdir: Path,
    policy: Mapping[str, Any] | None = None,
    *,
    extra_args: list[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[Server]:
    """`gpu-stack-webhook serve` over TLS on a free port; TMPDIR is `workdir/tmp` so tests can see
    what the server leaves behind there."""
    workdir.mkdir(parents=True, exist_ok=True)
    pki = make_pki(workdir / "pki")
    config = workdir / "policy.yaml"
    config.write_text(yaml.safe_dump(dict(policy or {})), encoding="utf-8")
    tmp = workdir / "tmp"
    tmp.mkdir(exist_ok=True)
    child_env = {
        **{k: v for k, v in os.environ.items() if k not in ("PROMETHEUS_MULTIPROC_DIR", "GPU_STACK_WEBHOOK_CONFIG")},
        "TMPDIR": str(tmp),
        "GPU_STACK_WEBHOOK_WORKERS": "2",
        "GPU_STACK_WEBHOOK_THREADS": "2",
        **dict(env or {}),
    }
    for attempt in range(3):  # another process may grab the free port before gunicorn binds it
        port = free_port()
        log_path = workdir / f"server-{attempt}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                _serve_args(pki, config, port, list(extra_args or [])),
                stdout=log, stderr=subprocess.STDOUT, env=child_env, cwd=workdir,
            )
        server = Server(process, port, pki, workdir, log_path)
        try:
            healthy = _wait_healthy(server)
        except BaseException:
            stop(server)
            raise
        if healthy:
            break
        stop(server)
        if "already in use" not in server.log():
            raise RuntimeError(f"gpu-stack-webhook exited with {process.returncode}:\n{server.log()}")
    else:
        raise RuntimeError(f"no free port after 3 attempts:\n{server.log()}")
    try:
        yield server
    finally:
        stop(server)


@contextlib.contextmanager
def serving_https(server: http.server.HTTPServer, pki: Pki) -> Iterator[int]:
    """Run a stdlib HTTP server over TLS (the test PKI) in a thread; yields its port, then stops it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pki.cert), str(pki.key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def listening_workers(server: Server) -> set[int]:
    """The gunicorn workers (children of the `serve` master) that hold a listening socket on the server's
    port. Each worker opens its own after the fork (SO_REUSEPORT); until it has, the kernel hands every
    new connection to the others, so a test about the spread over workers waits for this first."""
    suffix = f":{server.port:04X}"
    listening: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[1].endswith(suffix) and fields[3] == "0A":  # 0A: LISTEN
                    listening.add(f"socket:[{fields[9]}]")
    workers: set[int] = set()
    for task in Path(f"/proc/{server.process.pid}/task").iterdir():
        with contextlib.suppress(OSError):
            workers |= {int(p) for p in (task / "children").read_text().split()}
    found: set[int] = set()
    for pid in workers:
        with contextlib.suppress(OSError):
            if any(fd.readlink().as_posix() in listening for fd in Path(f"/proc/{pid}/fd").iterdir()):
                found.add(pid)
    return found


def wait_for_listening_workers(server: Server, count: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while len(listening_workers(server)) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{count} workers were not listening after {seconds}s: {listening_workers(server)}")
        time.sleep(0.05)
