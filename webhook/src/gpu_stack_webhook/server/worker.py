"""gunicorn's gthread worker, changed so that a thread only ever gets a connection with a request to read.

Why (measured in BENCHMARKS.md "Many keep-alive clients"): gunicorn 27's gthread worker hands
every accepted connection to a pool thread at once, and that thread does the TLS handshake and reads
the first request with blocking reads and no timeout (`TConn.init`, `handle`: `setblocking(True)`).
A TLS connection that completes its handshake and then sends nothing pins the thread until the client
uses or closes it. Go's HTTP client (the API server, hey) makes such connections all the time: when
a request finds no idle connection it dials a new one, and if another connection frees up first it
sends the request there and parks the fresh one, unused. The slower the server answers, the more
dials lose that race, so past `workers x threads` clients every thread soon sits on an idle
connection and the webhook stalls (8 clients ~3,000 reviews/s; 50 clients ~30/s, requests past 12 s).
A plain TCP connection that sends nothing holds a thread for 5 s (`wait_for_data`) before it is
parked. A third, smaller hole: bytes already decrypted inside the SSL object (`SSLSocket.pending()`,
e.g. a pipelined request in the same TLS record) do not make the socket readable, so a kept-alive
connection put back on the poller with such bytes waits there for the keep-alive timeout.

What this worker does instead (the rest is gthread unchanged):
* the main loop accepts, and drives the TLS handshake without blocking on the poller (SSLWantRead /
  SSLWantWrite), so a silent or slow handshake costs a file descriptor, not a thread; a handshake
  not complete after HANDSHAKE_TIMEOUT seconds is closed;
* a handshaken connection waits on the poller, like a kept-alive one, until it is readable; only then
  does it go to a thread (`data_ready`), and gthread's `handle` reads the request;
* a connection that finished a request with decrypted bytes still inside the SSL object goes straight
  back to a thread instead of to the poller.
A client that sends part of a request and stops still holds a thread while it reads; the request
deadline of slowclients.py cuts that.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import selectors
import ssl
import time
from collections import deque
from concurrent.futures import Future
from functools import partial
from typing import Any

from gunicorn import http, util
from gunicorn import sock as gunicorn_sock
from gunicorn.workers.gthread import STOP_KEEPALIVE_LINGER, TConn, ThreadWorker

# Seconds a new connection may take to complete its TLS handshake (a real client needs milliseconds).
HANDSHAKE_TIMEOUT = 10.0
# glibc mallopt(3) parameters (malloc.h) and the values set in each worker, see tune_malloc.
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's initial value, kept fixed
ARENA_MAX = 2


def tune_malloc() -> None:
    """Let a worker give back the memory of a large review once it is answered (worker RSS
    after the 200-container sweep). glibc raises its mmap threshold after freeing an mmapped block, so
    after the first large body every later one (up to 32 MiB) comes from the heap, whose free space
    is rarely returned, one heap per thread (arenas). A fixed threshold keeps blocks of 128 KiB and
    more (request bodies, parsed strings) in mmap, unmapped when freed; two arenas bound the per-thread
    heaps (measured: worker VmRSS after the sweep 80 -> 65-67 MB). A no-op without glibc's mallopt."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        mallopt(M_ARENA_MAX, ARENA_MAX)


class PollingThreadWorker(ThreadWorker):  # type: ignore[misc]
    """gthread with the handshake and the wait for a first request on the poller (see the module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handshaking: deque[TConn] = deque()

    def init_process(self) -> None:
        tune_malloc()  # before the thread pool exists: arenas are made per thread
        super().init_process()

    @classmethod
    def check_config(cls, cfg: Any, log: Any) -> None:
        super().check_config(cfg, log)
        if "h2" in (cfg.http_protocols or []):
            raise RuntimeError("PollingThreadWorker serves HTTP/1.1 only; drop h2 from http_protocols")

    def accept(self, listener: Any) -> None:
        try:
            client_sock, client_addr = listener.accept()
        except OSError as exc:
            if exc.errno not in _ACCEPT_RETRY:
                raise
            return
        self.nr_conns += 1
        conn = TConn(self.cfg, client_sock, client_addr, listener.getsockname())  # non-blocking
        if not self.cfg.is_ssl:
            self._wait_for_request(conn)
            return
        try:
            conn.sock = gunicorn_sock.ssl_context(self.cfg).wrap_socket(
                client_sock, server_side=True, do_handshake_on_connect=False,
                suppress_ragged_eofs=self.cfg.suppress_ragged_eofs)
        except (OSError, ValueError) as exc:
            self._drop(conn, "TLS wrap failed", exc)
            return
        conn.timeout = time.monotonic() + HANDSHAKE_TIMEOUT
        self.handshaking.append(conn)
        self._handshake_step(conn)

    def _handshake_step(self, conn: TConn) -> None:
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_handshake_io, conn))
            return
        except ssl.SSLWantWriteError:
            self.poller.register(conn.sock, selectors.EVENT_WRITE, partial(self._on_handshake_io, conn))
            return
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            self.handshaking.remove(conn)
            self._drop(conn, "TLS handshake failed", exc)
            return
        self.handshaking.remove(conn)
        # What TConn.init does after its own handshake (HTTP/1.1 only, see check_config).
        conn.initialized = True
        conn.parser = http.get_parser(self.cfg, conn.sock, conn.client)
        self._wait_for_request(conn)

    def _on_handshake_io(self, conn: TConn, client: Any) -> None:
        self.poller.unregister(client)
        self._handshake_step(conn)

    def _wait_for_request(self, conn: TConn) -> None:
        """Park a new connection on the poller until it has bytes to read (gthread's pending list)."""
        if _decrypted_bytes(conn.sock):
            conn.data_ready = True
            self.enqueue_req(conn)
            return
        conn.timeout = time.monotonic() + self.cfg.keepalive
        self.pending_conns.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self.on_pending_socket_readable, conn))

    def _drop(self, conn: TConn, what: str, exc: BaseException) -> None:
        self.log.debug("%s for %s: %s", what, conn.client, exc)
        self.nr_conns -= 1
        util.close(conn.sock)

    def murder_pending(self) -> None:
        now = time.monotonic()
        if not self.alive:
            # Stopping: connections that never sent a request are not kept for their keep-alive timeout
            # (gthread only caps the kept-alive ones), or a silent client would hold the pod's shutdown.
            # Capping every entry at the same deadline keeps both deques sorted.
            for conn in (*self.pending_conns, *self.handshaking):
                conn.timeout = min(conn.timeout, now + STOP_KEEPALIVE_LINGER)
        super().murder_pending()
        while self.handshaking and self.handshaking[0].timeout <= now:
            conn = self.handshaking.popleft()
            with contextlib.suppress(OSError, KeyError, ValueError):  # never registered, or closed
                self.poller.unregister(conn.sock)
            self._drop(conn, "TLS handshake timed out", TimeoutError(HANDSHAKE_TIMEOUT))

    def finish_request(self, conn: TConn, fs: Future[Any]) -> None:
        if (self.alive and not fs.cancelled() and fs.exception() is None and fs.result() is True
                and _decrypted_bytes(conn.sock)):
            # The next request is already decrypted inside the SSL object: the poller would not see it.
            self.enqueue_req(conn)
            return
        super().finish_request(conn, fs)


_ACCEPT_RETRY = {errno.EAGAIN, errno.EWOULDBLOCK, errno.ECONNABORTED}


def _decrypted_bytes(sock: Any) -> int:
    pending = getattr(sock, "pending", None)
    try:
        return int(pending()) if pending else 0
    except (OSError, ValueError):
        return 0
