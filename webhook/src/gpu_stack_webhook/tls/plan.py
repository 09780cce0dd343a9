"""The self-managed TLS lifecycle as a pure plan: from the Secret as read, the webhook configurations as
read, the time and the settings, what the Secret should hold and which caBundles are stale. No I/O: the
side effects (reading, writing with optimistic concurrency, files, readiness) are in selfmanaged.py.

One Secret (type kubernetes.io/tls) per release holds the CA and the serving pair (keys in config.py). The
plan for it (`plan_secret`) is one of:

* CREATE: there is none; a new CA and serving certificate.
* REFUSE: a Secret of another type has the name; it is reported, never overwritten.
* REPAIR: the CA part is unusable (the problem says what is wrong); a new CA and serving certificate,
  still-valid CA certificates of the old bundle stay trusted.
* UPDATE: the material needs a change (`plan_material`, the reasons say which) or the Secret lacks its
  owner, the ValidatingWebhookConfiguration (else the mutating one), so that the garbage collector
  deletes it after `helm uninstall`.
* KEEP: nothing to do.

`plan_material` re-issues a serving certificate with less than `cert_renew_before` left (or wrong names, or
not signed by the current CA) and rotates the CA with an overlap:
  a. `ca_renew_before` before the CA expires a *pending* CA is made and added to the bundle (`ca.crt` holds
     every CA to trust; its key waits under `ca-next.key`);
  b. only once that bundle is in the caBundle of every webhook of the configurations (`published`) and
     `ca_overlap` has passed is the pending CA promoted and a serving certificate signed by it issued;
  c. expired CAs leave the bundle.
So the API server trusts a new CA before any certificate it signs is served. `stale_webhooks` names the
webhooks of a configuration whose caBundle is not the Secret's bundle (they are patched).
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpu_stack_webhook.kube.client import ADMISSION_API_VERSION
from gpu_stack_webhook.kube.objects import TLS_SECRET_TYPE, SecretObject, WebhookConfiguration
from gpu_stack_webhook.tls.config import CA_CRT, LABELS, NEXT_ADDED_ANNOTATION, SelfManagedTls
from gpu_stack_webhook.tls.material import (
    CorruptSecret,
    Material,
    fingerprint,
    fresh_material,
    load_bundle,
    new_ca,
    parse_material,
    serving_cert,
    valid_at,
)


@dataclass(frozen=True)
class Plan:
    """What the material should be after one reconcile, and why it changed (no reasons: unchanged)."""

    material: Material
    annotations: dict[str, str]
    reasons: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.reasons)


def plan_material(
    material: Material,
    annotations: Mapping[str, str],
    settings: SelfManagedTls,
    now: datetime.datetime,
    published: frozenset[bytes],
) -> Plan:
    """What the Secret should hold now. `published`: fingerprints of the CA certificates present in the
    caBundle of every webhook of both configurations (read at the start of this reconcile)."""
    reasons: list[str] = []
    notes = dict(annotations)
    m = material
    # a. start a CA rotation
    ca_left = m.signing.certificate.not_valid_after_utc - now
    if m.pending is None and ca_left < settings.ca_renew_before:
        pending = new_ca(settings, now)
        m = replace(m, pending=pending, bundle=(m.bundle[0], pending.certificate, *m.bundle[1:]))
        notes[NEXT_ADDED_ANNOTATION] = now.isoformat()
        reasons.append(f"the CA expires in {ca_left.days} days: a new CA joins the bundle")
    # b. promote the pending CA once the bundle with it is published and the overlap has passed
    elif m.pending is not None:
        added = _parse_time(notes.get(NEXT_ADDED_ANNOTATION)) or now
        if fingerprint(m.pending.certificate) not in published:
            pass  # patched by this reconcile; promoted on a later one
        elif now - added >= settings.ca_overlap:
            promoted = m.pending.certificate
            others = tuple(c for c in m.bundle if fingerprint(c) != fingerprint(promoted))
            m = replace(m, signing=m.pending, pending=None, bundle=(promoted, *others), serving=None,
                        serving_problem="the CA was rotated")
            notes.pop(NEXT_ADDED_ANNOTATION, None)
            reasons.append("the new CA is in every caBundle: it now signs the serving certificate")
    else:
        notes.pop(NEXT_ADDED_ANNOTATION, None)
    # c. expired CAs leave the bundle
    kept = tuple(c for c in m.bundle if valid_at(c, now))
    if len(kept) != len(m.bundle):
        m = replace(m, bundle=kept)
        reasons.append("expired CA certificates left the bundle")
    # the serving pair
    if m.serving is None:
        reasons.append(f"new serving certificate: {m.serving_problem or 'none yet'}")
        m = replace(m, serving=serving_cert(settings, m.signing, now), serving_problem="")
    else:
        left = m.serving.certificate.not_valid_after_utc - now
        if left < settings.cert_renew_before:
            until = m.serving.certificate.not_valid_after_utc.isoformat()
            reasons.append(f"the serving certificate expires at {until}, within {settings.cert_renew_before}: renewed")
            m = replace(m, serving=serving_cert(settings, m.signing, now))
    return Plan(material=m, annotations=notes, reasons=tuple(reasons))


def _parse_time(raw: str | None) -> datetime.datetime | None:
    if not raw:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(raw)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


class Action(enum.Enum):
    KEEP = "keep"
    CREATE = "create"
    UPDATE = "update"
    REPAIR = "repair"
    REFUSE = "refuse"


@dataclass(frozen=True)
class SecretPlan:
    """One decision about the Secret. `secret`: the object to create (CREATE) or replace (UPDATE, REPAIR,
    carrying the resourceVersion read). `problem`: what is wrong, for the log (the corruption for REPAIR,
    an unusable serving pair for UPDATE, the refusal for REFUSE), "" when nothing is."""

    action: Action
    material: Material | None = None
    secret: SecretObject | None = None
    reasons: tuple[str, ...] = ()
    problem: str = ""


def plan_secret(
    secret: SecretObject | None,
    settings: SelfManagedTls,
    now: datetime.datetime,
    published: frozenset[bytes] = frozenset(),
    owner: tuple[Mapping[str, Any], ...] = (),
) -> SecretPlan:
    """What to do with the Secret as read (None: absent). `owner`: the ownerReferences a new Secret gets
    (`owner_references`), empty while the webhook configuration does not exist."""
    if secret is None:
        material = fresh_material(settings, now)
        return SecretPlan(Action.CREATE, material, secret_object(settings, material, {}, None, owner), ("created",))
    if secret.type != TLS_SECRET_TYPE:
        return SecretPlan(Action.REFUSE, problem=f"{settings.where} has type {secret.type}, not {TLS_SECRET_TYPE}; "
                                                 "delete it so the webhook can create its own")
    annotations = dict(secret.annotations)
    try:
        material = parse_material(secret.data, settings.dns_names, now)
    except CorruptSecret as exc:
        material = fresh_material(settings, now, keep=load_bundle(secret.data.get(CA_CRT, b"")))
        annotations.pop(NEXT_ADDED_ANNOTATION, None)
        return SecretPlan(Action.REPAIR, material, secret_object(settings, material, annotations, secret, owner),
                          (f"corrupted: {exc}",), problem=str(exc))
    problem = material.serving_problem
    result = plan_material(material, annotations, settings, now, published)
    if not result.changed and (secret.owner_references or not owner):
        return SecretPlan(Action.KEEP, result.material, problem=problem)
    return SecretPlan(Action.UPDATE, result.material,
                      secret_object(settings, result.material, result.annotations, secret, owner),
                      result.reasons, problem=problem)


def secret_object(settings: SelfManagedTls, material: Material, annotations: Mapping[str, str],
                  base: SecretObject | None, owner: tuple[Mapping[str, Any], ...]) -> SecretObject:
    """The Secret holding `material`: our labels added to those read, the owner kept once set."""
    labels = {**(dict(base.labels) if base else {}), **LABELS}
    owners = tuple(base.owner_references) if base and base.owner_references else owner
    return SecretObject(
        namespace=settings.namespace, name=settings.secret_name, data=material.data(),
        labels=labels, annotations=dict(annotations), owner_references=owners,
        resource_version=base.resource_version if base else "",
    )


def owner_references(config: WebhookConfiguration | None) -> tuple[dict[str, str], ...]:
    """The ownerReferences pointing at `config` (none while it does not exist)."""
    if config is None or not config.uid:
        return ()
    return ({"apiVersion": ADMISSION_API_VERSION, "kind": config.kind, "name": config.name, "uid": config.uid},)


def published_fingerprints(configs: Sequence[WebhookConfiguration | None]) -> frozenset[bytes]:
    """Fingerprints of the CA certificates present in the caBundle of every webhook of every configuration
    (none when a configuration is missing or has no webhooks)."""
    common: set[bytes] | None = None
    for config in configs:
        if config is None or not config.ca_bundles:
            return frozenset()
        for bundle in config.ca_bundles.values():
            found = {fingerprint(c) for c in load_bundle(bundle)}
            common = found if common is None else common & found
    return frozenset(common or ())


def stale_webhooks(config: WebhookConfiguration, bundle: bytes) -> list[str]:
    """The webhooks of `config` whose caBundle is not `bundle`: the ones to patch."""
    return [hook for hook, current in config.ca_bundles.items() if current != bundle]


def holds_bundle(config: WebhookConfiguration, bundle: bytes) -> bool:
    """Every webhook of `config` (at least one) trusts exactly `bundle`."""
    return bool(config.ca_bundles) and not stale_webhooks(config, bundle)
