"""Many connections against a real `gpu-stack-webhook serve` (2 workers x 2 threads over TLS).

gunicorn's stock gthread worker gives each new connection to a thread that handshakes and then waits,
with no timeout, for the first request; Go's HTTP client (the API server) leaves freshly dialled,
never used connections open all the time, so a few of them stopped the webhook. worker.py keeps
those connections on the poller. These tests hold more silent connections open than there are
threads, for the whole test, and check that a normal review is still answered; the request deadline
of slowclients.py is set far beyond the client's timeout so it cannot be what rescues the request.
No timings are asserted: a stall shows up as no answer at all while the silent connections are held.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .podlib import container, make_pod, review
from .test_faults import wait_for, worker_pids
from .tls_helpers import Server, client_context, running_server, wait_for_listening_workers

POD = make_pod([container("main", gpu=1)])
SLOTS = 2 * 2  # workers x threads in running_server
SILENT = 3 * SLOTS
# The watchdog must not be what frees the threads; the client gives up well before it would.
ENV = {"GPU_STACK_WEBHOOK_REQUEST_TIMEOUT": "600"}
CLIENT_TIMEOUT = 20.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("many-clients"), env=ENV) as running:
        yield running


def answered(server: Server) -> dict[str, Any]:
    """One review on a new TLS connection; raises (timeout) when the webhook does not answer."""
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=client_context(server.pki),
                                       timeout=CLIENT_TIMEOUT)
    try:
        conn.request("POST", "/validate", body=json.dumps(review(POD)), headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        assert reply.status == 200
        body: dict[str, Any] = json.loads(reply.read())
        return body
    finally:
        conn.close()


@contextlib.contextmanager
def silent_connections(server: Server, count: int, *, tls: bool) -> Iterator[list[socket.socket]]:
    """`count` connections that connect (and with tls=True complete the handshake) and send nothing."""
    context = client_context(server.pki)
    opened: list[socket.socket] = []
    try:
        for _ in range(count):
            raw = socket.create_connection(("127.0.0.1", server.port), timeout=CLIENT_TIMEOUT)
            opened.append(context.wrap_socket(raw, server_hostname="localhost") if tls else raw)
        yield opened
    finally:
        for sock in opened:
            sock.close()


def test_handshaken_connections_that_send_nothing_do_not_hold_the_threads(server: Server) -> None:
    # Go's HTTP client leaves exactly these behind: dialled, TLS done, never used.
    with silent_connections(server, SILENT, tls=True):
        assert answered(server)["response"]["allowed"] is True
        assert answered(server)["response"]["allowed"] is True


def test_connections_that_never_start_tls_do_not_hold_the_threads(server: Server) -> None:
    # Stock gthread gave each of these a thread for 5 s before parking it.
    with silent_connections(server, SILENT, tls=False):
        assert answered(server)["response"]["allowed"] is True


def test_a_silent_tls_handshake_does_not_hold_the_threads(server: Server) -> None:
    # A ClientHello and then nothing: the handshake waits on the poller, not in a thread.
    context = client_context(server.pki)
    with contextlib.ExitStack() as stack:
        for _ in range(SILENT):
            raw = stack.enter_context(socket.create_connection(("127.0.0.1", server.port), timeout=CLIENT_TIMEOUT))
            tls = context.wrap_socket(raw, server_hostname="localhost", do_handshake_on_connect=False)
            with contextlib.suppress(ssl.SSLWantReadError):
                tls.setblocking(False)
                tls.do_handshake()  # sends the ClientHello, does not wait for the answer
            stack.callback(tls.close)
        assert answered(server)["response"]["allowed"] is True


def _request(body: bytes) -> bytes:
    head = ("POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def test_a_request_already_decrypted_behind_the_previous_one_is_answered(server: Server) -> None:
    """A ~30 KB review and a small one written together: the small one ends inside the TLS record that
    carries the end of the big one, so after the first answer its bytes sit decrypted in the SSL object
    (SSLSocket.pending()) and the kernel socket is not readable. Stock gthread parked the connection on
    its poller and the second review waited for the keep-alive timeout (100 s)."""
    big = review(make_pod([container("main", gpu=1)], annotations={"pad": "x" * 30000}))
    small = review(POD)
    context = client_context(server.pki)
    with socket.create_connection(("127.0.0.1", server.port), timeout=CLIENT_TIMEOUT) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        tls.sendall(_request(json.dumps(big).encode()) + _request(json.dumps(small).encode()))
        received = b""
        while received.count(b"HTTP/1.1 200 OK") < 2 or not received.rstrip().endswith(b"}}"):
            chunk = tls.recv(65536)  # raises TimeoutError when the second answer never comes
            assert chunk, f"connection closed after {received.count(b'HTTP/1.1 ')} answers"
            received += chunk
    assert received.count(b'"allowed":true') == 2


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = fd.readlink().as_posix()
            if target.startswith("socket:"):
                inodes.add(target)
    return inodes


def test_keep_alive_connections_are_spread_over_every_worker(server: Server) -> None:
    """Kept-alive connections stay with the worker that accepted them. Each worker has its
    own listening socket (SO_REUSEPORT), so the kernel spreads new connections over the workers; with
    16 connections the chance that one worker gets none is 2 in 65,536."""
    # An earlier test of this module may have had a worker replaced: wait until both serve again.
    wait_for(lambda: len(worker_pids(server)) == 2 and answered(server)["response"]["allowed"], 30, "two workers")
    wait_for_listening_workers(server, 2)
    workers = worker_pids(server)
    before = {pid: _socket_inodes(pid) for pid in workers}
    clients = [http.client.HTTPSConnection("127.0.0.1", server.port, context=client_context(server.pki),
                                           timeout=CLIENT_TIMEOUT) for _ in range(16)]
    try:
        for conn in clients:  # every connection serves a review and stays open (keep-alive)
            conn.request("POST", "/validate", body=json.dumps(review(POD)),
                         headers={"Content-Type": "application/json"})
            reply = conn.getresponse()
            assert reply.status == 200 and json.loads(reply.read())["response"]["allowed"] is True
        held = {pid: len(_socket_inodes(pid) - before[pid]) for pid in workers}
    finally:
        for conn in clients:
            conn.close()
    assert sum(held.values()) >= 16, held
    assert all(count > 0 for count in held.values()), f"connections per worker: {held}"


def _readyz(server: Server, timeout: float) -> int:
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=client_context(server.pki), timeout=timeout)
    try:
        conn.request("GET", "/readyz")
        return conn.getresponse().status
    finally:
        conn.close()


def test_the_readiness_probe_fails_while_the_workers_cannot_answer(server: Server) -> None:
    """The chart's readiness probe is `GET /readyz` over HTTPS with a 1 s timeout. With every worker
    stopped (SIGSTOP) the kernel still completes TCP connections into the listen backlog, so a TCP
    probe would pass; the HTTPS probe times out. Once the workers run again it passes."""
    workers = worker_pids(server)
    assert _readyz(server, 1.0) == 200
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=1.0):
            pass  # what a tcpSocket probe checks: it would pass
        with pytest.raises((TimeoutError, ssl.SSLError, OSError)):
            _readyz(server, 1.0)
    finally:
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
    assert _readyz(server, CLIENT_TIMEOUT) == 200
