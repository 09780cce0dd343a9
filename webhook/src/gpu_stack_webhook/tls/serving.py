"""The server's SSLContext: TLS 1.2 at least, the pair checked before anything binds, and a renewed
certificate picked up without restarting anything.

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

from gpu_stack_webhook.filewatch import Signature, file_signature

log = logging.getLogger("gpu_stack_webhook.tls")

MIN_TLS_VERSION = ssl.TLSVersion.TLSv1_2
PairSignature = tuple[Signature | None, Signature | None]


def check_pair(cert: str, key: str) -> None:
    """Fail before gunicorn binds anything when the pair cannot be loaded (gunicorn would only notice
    in each worker, on the first connection): a ValueError saying why."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certfile=cert, keyfile=key)
    except ssl.SSLError as exc:  # before OSError: SSLError is one
        raise ValueError(f"TLS certificate {cert} and key {key} cannot be used: {exc.reason or exc}") from None
    except OSError as exc:
        raise ValueError(f"cannot read TLS certificate {cert} / key {key}: {exc.strerror or exc}") from None


def with_floor(default_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """The default context (cert chain, no client certs) with TLS 1.2 as the floor and no compression."""
    context = default_factory()
    # MINIMUM_SUPPORTED (-2) and real versions below 1.2 are raised; a stricter floor (1.3) is kept.
    context.minimum_version = max(context.minimum_version, MIN_TLS_VERSION)
    context.options |= ssl.OP_NO_COMPRESSION
    return context


def server_context(default_factory: Callable[[], ssl.SSLContext], certfile: str | None,
                   keyfile: str | None) -> ssl.SSLContext:
    """With a pair of files, one context per process that reloads a renewed certificate on the next
    handshake instead of reading the files for every connection; else the context with its floor."""
    if certfile is None or keyfile is None:
        return with_floor(default_factory)
    return reloading_context(certfile, keyfile, lambda: with_floor(default_factory))


def _pair_signature(certfile: str, keyfile: str) -> PairSignature:
    return file_signature(certfile), file_signature(keyfile)


class ReloadingContext:
    def __init__(self, certfile: str, keyfile: str, factory: Callable[[], ssl.SSLContext]) -> None:
        self.certfile = certfile
        self.keyfile = keyfile
        self.factory = factory
        self.lock = threading.Lock()
        self.signature = _pair_signature(certfile, keyfile)
        self.context = factory()  # the one gunicorn wraps sockets with
        self.current = self.context
        self.failed: PairSignature | None = None
        self.context.sni_callback = self._on_client_hello

    def _refresh(self) -> ssl.SSLContext:
        signature = _pair_signature(self.certfile, self.keyfile)
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
