"""The objects the webhook writes through `KubeApi` (kube/client.py): its TLS Secret and its webhook
configurations' caBundles, as plain values built from and turned into API bodies."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TLS_SECRET_TYPE = "kubernetes.io/tls"  # noqa: S105 - a Secret type, not a password


@dataclass(frozen=True)
class SecretObject:
    """A Secret as the webhook uses it: data decoded to bytes."""

    namespace: str
    name: str
    data: Mapping[str, bytes]
    type: str = TLS_SECRET_TYPE
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    owner_references: tuple[Mapping[str, Any], ...] = ()
    resource_version: str = ""
    uid: str = ""

    def to_body(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if self.labels:
            metadata["labels"] = dict(self.labels)
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        if self.owner_references:
            metadata["ownerReferences"] = [dict(r) for r in self.owner_references]
        if self.resource_version:
            metadata["resourceVersion"] = self.resource_version
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata,
            "type": self.type,
            "data": {k: base64.b64encode(v).decode() for k, v in sorted(self.data.items())},
        }

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> SecretObject:
        meta = body.get("metadata") or {}
        data = {k: base64.b64decode(v or "") for k, v in (body.get("data") or {}).items()}
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            data=data,
            type=str(body.get("type") or "Opaque"),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            owner_references=tuple(dict(r) for r in meta.get("ownerReferences") or ()),
            resource_version=str(meta.get("resourceVersion") or ""),
            uid=str(meta.get("uid") or ""),
        )


@dataclass(frozen=True)
class WebhookConfiguration:
    """One Mutating/ValidatingWebhookConfiguration: its uid and each webhook's caBundle (PEM, b"" if unset)."""

    kind: str
    name: str
    uid: str
    ca_bundles: Mapping[str, bytes]

    @classmethod
    def from_body(cls, kind: str, body: Mapping[str, Any]) -> WebhookConfiguration:
        meta = body.get("metadata") or {}
        bundles = {}
        for hook in body.get("webhooks") or ():
            raw = (hook.get("clientConfig") or {}).get("caBundle") or ""
            bundles[str(hook.get("name"))] = base64.b64decode(raw)
        return cls(kind=kind, name=str(meta.get("name") or ""), uid=str(meta.get("uid") or ""), ca_bundles=bundles)


def ca_bundle_patch(webhook_names: Sequence[str], ca_bundle: bytes) -> dict[str, Any]:
    """The strategic merge patch that sets caBundle of the named webhooks only: `webhooks` merges by
    `name` and every other field is kept. (A JSON merge patch of `webhooks` would replace the whole
    list and the apiserver answers 422, as the recorded v1.36 exchanges show.)"""
    encoded = base64.b64encode(ca_bundle).decode()
    return {"webhooks": [{"name": n, "clientConfig": {"caBundle": encoded}} for n in webhook_names]}
