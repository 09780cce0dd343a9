"""Self-managed TLS, the side effects: carry out the plan (plan.py) through the Kubernetes adapter.

Each replica runs `TlsManager.reconcile()` before gunicorn binds and then periodically in the gunicorn
master (`Renewer`). One reconcile:

1. reads the webhook configurations (the Secret's owner, and which CAs their caBundles already trust) and
   the Secret, and plans. Optimistic concurrency throughout: a create that meets 409 AlreadyExists
   re-reads and plans again with what the other replica wrote (so replicas starting together agree on one
   CA); a replace carries the resourceVersion read, and a 409 Conflict re-reads and plans again. A
   corrupted Secret or an unusable serving pair is logged at ERROR with what was wrong.
2. patches the bundle into the caBundle of every webhook of ITS OWN webhook configurations (strategic
   merge patch by webhook name);
3. writes tls.crt/tls.key where gunicorn reads them (workers pick a new pair up on their next handshake,
   see tls/serving.py) and, once the caBundle is in place, the ready-file /readyz checks.
"""

from __future__ import annotations

import datetime
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpu_stack_webhook.kube.client import AlreadyExists, Conflict, KubeApi, KubeError
from gpu_stack_webhook.kube.objects import SecretObject
from gpu_stack_webhook.tls.config import SelfManagedTls
from gpu_stack_webhook.tls.files import mark_ready, write_pair
from gpu_stack_webhook.tls.material import Material
from gpu_stack_webhook.tls.plan import (
    Action,
    holds_bundle,
    owner_references,
    plan_secret,
    published_fingerprints,
    stale_webhooks,
)

log = logging.getLogger("gpu_stack_webhook.tls")

MAX_ATTEMPTS = 8


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass
class Status:
    ready: bool = False
    bundle: bytes = b""
    reasons: list[str] = field(default_factory=list)
    error: str = ""


class TlsManager:
    def __init__(self, api: KubeApi, settings: SelfManagedTls, clock: Callable[[], datetime.datetime] = utcnow) -> None:
        self.api = api
        self.settings = settings
        self.clock = clock
        self.lock = threading.Lock()
        self.status = Status()

    @property
    def where(self) -> str:
        return self.settings.where

    def ensure_secret(self) -> tuple[SecretObject, Material]:
        """Read, create or update the Secret until it holds usable material; returns both."""
        settings, where = self.settings, self.where
        configs = [self.api.read_webhook_configuration(kind, name) for kind, name in settings.configurations]
        # The ValidatingWebhookConfiguration, else (validation in CEL) the mutating one.
        owner = owner_references(configs[-1])
        published = published_fingerprints(configs)
        for _ in range(MAX_ATTEMPTS):
            secret = self.api.read_secret(settings.namespace, settings.secret_name)
            plan = plan_secret(secret, settings, self.clock(), published, owner)
            if plan.action is Action.REFUSE:
                raise KubeError(0, "WrongType", plan.problem)
            if plan.action is Action.REPAIR:
                log.error("%s is corrupted (%s); replacing it with a new CA and serving certificate", where,
                          plan.problem)
            elif plan.problem:
                log.error("%s holds an unusable serving certificate (%s); issuing a new one with the same CA",
                          where, plan.problem)
            if plan.action is Action.KEEP:
                assert secret is not None and plan.material is not None
                return secret, plan.material
            assert plan.secret is not None and plan.material is not None
            if plan.action is Action.CREATE:
                try:
                    written = self.api.create_secret(plan.secret)
                except AlreadyExists:
                    log.info("%s was created by another replica meanwhile; using it", where)
                    continue
                log.info("created %s with a new CA and serving certificate", where)
            else:
                try:
                    written = self.api.replace_secret(plan.secret)
                except Conflict:
                    log.info("%s changed meanwhile (resourceVersion %s is stale); re-reading", where,
                             plan.secret.resource_version)
                    continue
                for reason in plan.reasons:
                    log.info("%s updated: %s", where, reason)
            self.status.reasons.extend(plan.reasons)
            return written, plan.material
        raise KubeError(409, "Conflict", f"{where}: still conflicting after {MAX_ATTEMPTS} attempts")

    def publish_bundle(self, bundle: bytes) -> bool:
        """Set caBundle of every webhook of the configurations to `bundle`; True when all hold it."""
        ok = True
        for kind, name in self.settings.configurations:
            config = self.api.read_webhook_configuration(kind, name)
            if config is None:
                log.warning("%s %s does not exist (yet); its caBundle is set on a later attempt", kind, name)
                ok = False
                continue
            stale = stale_webhooks(config, bundle)
            if stale:
                config = self.api.patch_ca_bundle(kind, name, stale, bundle)
                log.info("patched caBundle of %s %s (webhooks %s)", kind, name, ", ".join(stale))
            ok = ok and holds_bundle(config, bundle)
        return ok

    def reconcile(self) -> Status:
        """One pass: Secret, caBundle, files, ready-file. Raises KubeError when the Secret cannot be
        made right (the caller retries); a caBundle problem only keeps the replica unready."""
        with self.lock:
            _, material = self.ensure_secret()
            assert material.serving is not None
            bundle = material.bundle_pem
            try:
                published = self.publish_bundle(bundle)
            except KubeError as exc:
                log.warning("cannot set the webhook configurations' caBundle: %s", exc)
                published = False
            if write_pair(self.settings, material.serving):
                log.info("serving certificate written to %s (serial %x, valid until %s)", self.settings.certfile,
                         material.serving.certificate.serial_number,
                         material.serving.certificate.not_valid_after_utc.isoformat())
            ready_file = self.settings.ready_file
            if published and mark_ready(ready_file):
                log.info("TLS ready: certificate served, caBundle in place")
            self.status = Status(ready=ready_file.exists(), bundle=bundle, reasons=self.status.reasons)
            return self.status

    def clear_ready(self) -> None:
        self.settings.ready_file.unlink(missing_ok=True)


class Renewer:
    """Background thread (in the gunicorn master): reconcile every `interval` (sooner while unready or
    after an error), with a little jitter so replicas do not all call the apiserver at once, and at once
    when `changes` (a wait for a change of the TLS Secret, up to the given seconds) says the Secret was
    changed or deleted: a deleted Secret is made again and the caBundles follow within seconds, not at the
    next interval. A `changes` that fails (RBAC without watch, say) is logged once; the loop then sleeps."""

    def __init__(self, manager: TlsManager, interval: float, retry: float = 10.0,
                 changes: Callable[[float], bool] | None = None) -> None:
        self.manager = manager
        self.interval = interval
        self.retry = min(retry, interval)
        self.changes = changes
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def _next_wait(self, ok: bool) -> float:
        base = self.interval if ok else self.retry
        return base * random.uniform(0.9, 1.1)  # noqa: S311 - jitter, not crypto

    def _wait(self, seconds: float) -> bool:
        """False once stopped."""
        if self.changes is not None:
            started = time.monotonic()
            try:
                self.changes(seconds)
                return not self.stopped.is_set()
            except Exception as exc:
                log.warning("TLS Secret watch failed (checking every %.0f s instead): %s: %s", self.interval,
                            type(exc).__name__, exc)
                self.changes = None
                seconds = max(0.0, seconds - (time.monotonic() - started))
        return not self.stopped.wait(seconds)

    def run(self) -> None:
        ok = self.manager.status.ready
        while self._wait(self._next_wait(ok)):
            try:
                ok = self.manager.reconcile().ready
            except Exception as exc:
                ok = False
                log.error("TLS renewal failed (retrying): %s: %s", type(exc).__name__, exc)

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self.run, name="gpu-stack-tls-renewer", daemon=True)
            self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
