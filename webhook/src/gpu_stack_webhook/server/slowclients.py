"""A per-request deadline for gunicorn gthread workers, so slow clients cannot hold every thread.

The webhook's worker (worker.PollingThreadWorker) keeps handshakes and connections that
have sent nothing on its poller, so what is left for this deadline is a client that sends part of a
request and stops. The description below is of gunicorn's stock gthread worker.

What gunicorn 27's gthread worker does by itself:
* a new connection that sends nothing does not take a thread: the worker waits up to 5 s for its
  first byte (DEFAULT_WORKER_DATA_TIMEOUT) and then parks it on the poller until keepalive expires;
* idle kept-alive connections wait on the poller too (keepalive, 100 s here), without a thread;
* but once a first byte is there, the thread does the TLS handshake and reads the request line,
  headers and body with blocking reads and NO timeout (`TConn.init` and `handle` call
  `sock.setblocking(True)`, which clears any socket timeout). A client sending its headers a byte at a
  time (slow loris) pins that thread for as long as it likes, and `workers x threads` such clients
  stop the webhook. The `timeout` setting does not help: the gthread main loop keeps notifying the
  arbiter while its threads are stuck.

The fix, installed by the `post_worker_init` hook `deadlines_hook` builds: every `handle(conn)` call is
registered with a deadline of `timeout` seconds (default 15, $GPU_STACK_WEBHOOK_REQUEST_TIMEOUT), and a watchdog
thread per worker shuts down (`shutdown(SHUT_RDWR)`) the socket of any call past its deadline, so the
blocked read returns at once, gunicorn closes the connection and the thread is free. A normal
AdmissionReview is answered in milliseconds; the apiserver itself gives up after the webhook's
timeoutSeconds (chart default 10 s), so nothing useful is ever cut. Each cut is logged (JSON, WARNING).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

WATCHDOG_PERIOD = 0.5

log = logging.getLogger("gpu_stack_webhook.server.slowclients")


class RequestDeadlines:
    """The in-flight `handle` calls of one worker and the watchdog that cuts the overdue ones."""

    def __init__(self, worker: Any, timeout: float) -> None:
        self.worker = worker
        self.timeout = timeout
        self.inflight: dict[int, tuple[float, Any]] = {}
        self.lock = threading.Lock()

    def wrap(self, handle: Any) -> Any:
        def guarded_handle(conn: Any) -> Any:
            key = id(conn)
            with self.lock:
                self.inflight[key] = (time.monotonic() + self.timeout, conn)
            try:
                return handle(conn)
            finally:
                with self.lock:
                    self.inflight.pop(key, None)

        return guarded_handle

    def sweep(self, now: float) -> int:
        with self.lock:
            overdue = [(key, conn) for key, (deadline, conn) in self.inflight.items() if deadline <= now]
            for key, _ in overdue:
                self.inflight.pop(key, None)  # cut once; handle's finally pops nothing more
        for _, conn in overdue:
            with contextlib.suppress(OSError, AttributeError, ValueError):  # already closed
                conn.sock.shutdown(socket.SHUT_RDWR)
            log.warning(
                "request not complete after %.0f s; connection closed", self.timeout,
                extra={"client": str(getattr(conn, "client", "")), "event": "request-timeout"},
            )
        return len(overdue)

    def run(self) -> None:
        while getattr(self.worker, "alive", True):
            time.sleep(WATCHDOG_PERIOD)
            try:
                self.sweep(time.monotonic())
            except Exception:  # the watchdog must never die
                log.exception("request watchdog failed")


def deadlines_hook(timeout: float) -> Callable[[Any], None]:
    """The gunicorn `post_worker_init` hook that guards every request of a worker with `timeout`
    seconds (WebhookSettings.request_timeout, read once in the master)."""

    def post_worker_init(worker: Any) -> None:
        """gunicorn hook (in each worker, after its thread pool exists, before it serves)."""
        if not hasattr(worker, "tpool"):  # not a gthread worker: nothing to guard
            return
        deadlines = RequestDeadlines(worker, timeout)
        # enqueue_req submits `self.handle`: an instance attribute wins over the class's method.
        worker.handle = deadlines.wrap(worker.handle)
        worker.request_deadlines = deadlines  # what the worker is guarded with, for inspection
        threading.Thread(target=deadlines.run, name="request-deadlines", daemon=True).start()

    return post_worker_init
