"""The serving pair and the ready-file on disk: where gunicorn reads the certificate, and what tells the
workers' /readyz that the certificate is served and the caBundle is in place."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from gpu_stack_webhook.tls.certs import KeyPair
from gpu_stack_webhook.tls.config import SelfManagedTls


def _write_atomic(path: Path, content: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, content)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_pair(settings: SelfManagedTls, pair: KeyPair) -> bool:
    """Write tls.crt/tls.key when they differ from what is there (key first: a reader that sees the new
    certificate with the old key fails to load and retries on the next handshake). True when written."""
    settings.cert_dir.mkdir(parents=True, exist_ok=True)
    try:
        same = settings.certfile.read_bytes() == pair.cert_pem and settings.keyfile.read_bytes() == pair.key_pem
    except OSError:
        same = False
    if same:
        return False
    _write_atomic(settings.keyfile, pair.key_pem, 0o600)
    _write_atomic(settings.certfile, pair.cert_pem, 0o644)
    return True


def mark_ready(ready_file: Path) -> bool:
    """Create the ready-file; True when it was not there before."""
    if ready_file.exists():
        return False
    ready_file.write_text("ready\n", encoding="utf-8")
    return True


def file_readiness(ready_file: Path) -> Callable[[], bool]:
    """The /readyz hook for the app: the master writes the file once the certificate is served and the
    caBundle is in place (gunicorn workers are separate processes, a file is what they all see)."""

    def ready() -> bool:
        return ready_file.exists()

    return ready
