"""The self-managed TLS lifecycle's settings and names: which Secret, Service and webhook configurations,
where the files go, how long certificates live, and the keys and labels the Secret carries."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from gpu_stack_webhook.kube.client import MUTATING, VALIDATING

# Secret keys: the serving pair, the trust bundle (signing CA first), the signing CA's key, and the pending
# CA's key (only during a CA rotation).
TLS_CRT, TLS_KEY, CA_CRT, CA_KEY, CA_NEXT_KEY = "tls.crt", "tls.key", "ca.crt", "ca.key", "ca-next.key"
NEXT_ADDED_ANNOTATION = "gpu-stack.io/ca-next-added"
READY_FILE = "ready"
LABELS = {
    "app.kubernetes.io/name": "gpu-stack-webhook",
    "app.kubernetes.io/component": "webhook-tls",
    "app.kubernetes.io/managed-by": "gpu-stack-webhook",
}
DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class SelfManagedTls:
    """What `serve --tls-mode self-managed` keeps: its Secret, Service and webhook configurations, where the
    pair is written and how long certificates live (from the TLS flags, server/cluster.py)."""

    namespace: str
    secret_name: str
    service_name: str
    mutating_configuration: str
    validating_configuration: str
    cert_dir: Path
    cert_validity: datetime.timedelta = 90 * DAY
    cert_renew_before: datetime.timedelta = 30 * DAY
    ca_validity: datetime.timedelta = 5 * 365 * DAY
    ca_renew_before: datetime.timedelta = 365 * DAY
    ca_overlap: datetime.timedelta = datetime.timedelta(hours=1)

    def __post_init__(self) -> None:
        if not self.cert_renew_before < self.cert_validity:
            raise ValueError("the serving certificate must be renewed before it expires (renew-before < validity)")
        if not self.ca_renew_before < self.ca_validity:
            raise ValueError("the CA must be renewed before it expires (ca renew-before < ca validity)")
        if not self.cert_renew_before < self.ca_renew_before:
            raise ValueError("the CA must be rotated before the serving certificates it signs are due")

    @property
    def dns_names(self) -> list[str]:
        svc, ns = self.service_name, self.namespace
        return [svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local"]

    @property
    def where(self) -> str:
        return f"Secret {self.namespace}/{self.secret_name}"

    @property
    def certfile(self) -> Path:
        return self.cert_dir / TLS_CRT

    @property
    def keyfile(self) -> Path:
        return self.cert_dir / TLS_KEY

    @property
    def ready_file(self) -> Path:
        return self.cert_dir / READY_FILE

    @property
    def configurations(self) -> tuple[tuple[str, str], ...]:
        # One of them is "" when the chart renders that half as CEL policies (webhook.*.mode=cel).
        return tuple((kind, name) for kind, name in ((MUTATING, self.mutating_configuration),
                                                     (VALIDATING, self.validating_configuration)) if name)
