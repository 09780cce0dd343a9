"""`serve --tls-mode self-managed` before gunicorn binds: the Secret, CA, serving certificate and caBundle
ensured (retried a few times, then `serve` exits), the pair written to the certificate directory, /readyz
answering from the ready-file the master writes, and the renewal thread to start in the gunicorn master."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_stack_webhook.kube.client import KubeError, KubernetesClientApi
from gpu_stack_webhook.tls.config import SelfManagedTls
from gpu_stack_webhook.tls.files import file_readiness
from gpu_stack_webhook.tls.selfmanaged import Renewer, TlsManager

log = logging.getLogger("gpu_stack_webhook.tls")

BOOTSTRAP_ATTEMPTS = 6


def bootstrap(manager: TlsManager, attempts: int = BOOTSTRAP_ATTEMPTS, sleep: Callable[[float], None] = time.sleep,
              ) -> None:
    """The first reconcile, before gunicorn binds: retried with backoff; raises ValueError at the end."""
    manager.clear_ready()
    for attempt in range(1, attempts + 1):
        try:
            status = manager.reconcile()
        except KubeError as exc:
            log.error("self-managed TLS: attempt %d/%d failed: %s", attempt, attempts, exc)
            if attempt == attempts:
                raise ValueError(f"self-managed TLS: cannot set up {manager.where}: {exc}") from None
            sleep(min(2 ** attempt, 10))
            continue
        if not status.ready:
            log.warning("self-managed TLS: certificate ready, caBundle not yet in place; /readyz stays false "
                        "until the renewal thread sets it")
        return


@dataclass(frozen=True)
class SelfManagedServing:
    """Where the pair is, the /readyz hook, and the gunicorn `when_ready` hook that starts the renewals."""

    certfile: str
    keyfile: str
    readiness: Callable[[], bool]
    when_ready: Callable[[Any], None]


def start(api: KubernetesClientApi, tls: SelfManagedTls, check_interval: float) -> SelfManagedServing:
    """Bootstrap now; renew every `check_interval` seconds, and whenever the Secret changes, once started."""
    manager = TlsManager(api, tls)
    bootstrap(manager)
    watch_api = KubernetesClientApi(api.api_client)
    renewer = Renewer(manager, interval=check_interval,
                      changes=lambda seconds: watch_api.wait_for_secret_change(tls.namespace, tls.secret_name, seconds))

    def when_ready(server: Any) -> None:
        renewer.start()

    return SelfManagedServing(certfile=str(tls.certfile), keyfile=str(tls.keyfile),
                              readiness=file_readiness(tls.ready_file), when_ready=when_ready)
