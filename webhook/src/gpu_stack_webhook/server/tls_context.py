"""A server SSLContext that picks up a renewed certificate without restarting anything.

gunicorn wraps every accepted connection with the context its `ssl_context` hook returns. The hook
returns one `ReloadingContext.context` per worker process; its `sni_callback` runs at the start of
every handshake (with or without SNI) and, when tls.crt or tls.key changed on disk (size, mtime or
inode), builds a fresh context from the files and switches the handshaking connection to it
(`SSLSocket.context = ...`). New handshakes get the new certificate; established connections keep
theirs and are never dropped. A pair that does not load (e.g. read between the two renames of a
renewal) is logged and the previous context kept; the next change of the files is tried again.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Callable

log = logging.getLogger("gpu_stack_webhook.tls")

Signature = tuple[tuple[int, int, int, int], ...]


def file_signature(*paths: str) -> Signature:
    out = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        except OSError:
            out.append((0, 0, 0, 0))
    return tuple(out)


class ReloadingContext:
    def __init__(self, certfile: str, keyfile: str, factory: Callable[[], ssl.SSLContext]) -> None:
        self.certfile = certfile
        self.keyfile = keyfile
        self.factory = factory
        self.lock = threading.Lock()
        self.signature = file_signature(certfile, keyfile)
        self.context = factory()  # the one gunicorn wraps sockets with
        self.current = self.context
        self.failed: Signature | None = None
        self.reloads = 0
        self.context.sni_callback = self._on_client_hello

    def _refresh(self) -> ssl.SSLContext:
        signature = file_signature(self.certfile, self.keyfile)
        if signature in (self.signature, self.failed):
            return self.current
        with self.lock:
            if signature in (self.signature, self.failed):
                return self.current
            try:
                fresh = self.factory()
            except (ssl.SSLError, OSError, ValueError) as exc:
                self.failed = signature
                log.warning("renewed TLS pair %s / %s does not load yet (%s); still serving the previous one",
                            self.certfile, self.keyfile, exc)
                return self.current
            self.current, self.signature, self.failed = fresh, signature, None
            self.reloads += 1
            log.info("TLS certificate reloaded from %s", self.certfile)
            return fresh

    def _on_client_hello(self, sock: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
                         context: ssl.SSLContext) -> None:
        current = self._refresh()
        if current is not sock.context:
            sock.context = current


_per_process: dict[tuple[int, str, str], ReloadingContext] = {}
_per_process_lock = threading.Lock()


def reloading_context(certfile: str, keyfile: str, factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """The context for this process and pair of files, made on first use (after the fork, in a worker)."""
    key = (os.getpid(), certfile, keyfile)
    with _per_process_lock:
        found = _per_process.get(key)
        if found is None:
            found = _per_process[key] = ReloadingContext(certfile, keyfile, factory)
    return found.context
