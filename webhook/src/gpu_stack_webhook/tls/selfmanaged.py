"""Self-managed TLS: the webhook keeps its own CA and serving certificate in one Secret.

Each replica runs `TlsManager.reconcile()` before gunicorn binds and then periodically in the gunicorn
master (`Renewer`). One reconcile:

1. reads the Secret (type kubernetes.io/tls) in the release namespace; when it is absent, creates it
   with a new CA and serving certificate. Optimistic concurrency throughout: a create that meets 409
   AlreadyExists re-reads and uses what the other replica wrote (so replicas starting together agree
   on one CA); a replace carries the resourceVersion read, and a 409 Conflict re-reads and decides again.
2. decides what has to change (`plan`, pure): a corrupted Secret is replaced (with an ERROR log line
   that says what was wrong), a serving certificate with less than `cert_renew_before` left (or wrong
   names, or not signed by the current CA) is re-issued, and the CA is rotated with an overlap:
     a. `ca_renew_before` before the CA expires a *pending* CA is made and added to the bundle
        (`ca.crt` holds every CA to trust; its key waits under `ca-next.key`);
     b. only once that bundle is in the caBundle of both webhook configurations and `ca_overlap` has
        passed is the pending CA promoted and a serving certificate signed by it issued;
     c. expired CAs leave the bundle.
   So the apiserver trusts a new CA before any certificate it signed is served.
3. patches the bundle into the caBundle of every webhook of ITS OWN two webhook configurations (strategic
   merge patch by webhook name), then writes tls.crt/tls.key where gunicorn reads them (atomic renames;
   workers pick the new pair up on their next handshake, see tls_reload.py).

Secret keys: tls.crt, tls.key (serving pair), ca.crt (the trust bundle: signing CA first), ca.key (the
signing CA's key), ca-next.key (only during a CA rotation). The Secret is owned by the
ValidatingWebhookConfiguration (a cluster-scoped owner of a namespaced dependent is allowed), so the
garbage collector deletes it after `helm uninstall`.
"""

from __future__ import annotations

import datetime
import logging
import os
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpu_stack_webhook.kube.client import (
    ADMISSION_API_VERSION,
    MUTATING,
    VALIDATING,
    AlreadyExists,
    Conflict,
    KubeApi,
    KubeError,
    SecretObject,
)
from gpu_stack_webhook.tls.certs import KeyPair, make_ca, make_serving_cert

log = logging.getLogger("gpu_stack_webhook.tls")

TLS_CRT, TLS_KEY, CA_CRT, CA_KEY, CA_NEXT_KEY = "tls.crt", "tls.key", "ca.crt", "ca.key", "ca-next.key"
NEXT_ADDED_ANNOTATION = "gpu-stack.io/ca-next-added"
READY_FILE = "ready"
LABELS = {
    "app.kubernetes.io/name": "gpu-stack-webhook",
    "app.kubernetes.io/component": "webhook-tls",
    "app.kubernetes.io/managed-by": "gpu-stack-webhook",
}
MAX_ATTEMPTS = 8
DAY = datetime.timedelta(days=1)


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True)
class Settings:
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


# --- parsing and planning (pure) ------------------------------------------------------------------------


class CorruptSecret(ValueError):
    """The CA part of the Secret cannot be used; the message says why."""


@dataclass(frozen=True)
class Material:
    """What the Secret holds, parsed. `bundle` is every CA certificate to trust (signing CA first)."""

    signing: KeyPair
    bundle: tuple[x509.Certificate, ...]
    pending: KeyPair | None = None
    serving: KeyPair | None = None
    # Why the serving pair cannot be used as it is ("" when it can).
    serving_problem: str = ""

    def data(self) -> dict[str, bytes]:
        out = {
            CA_CRT: b"".join(c.public_bytes(serialization.Encoding.PEM) for c in self.bundle),
            CA_KEY: self.signing.key_pem,
            TLS_CRT: self.serving.cert_pem if self.serving else b"",
            TLS_KEY: self.serving.key_pem if self.serving else b"",
        }
        if self.pending:
            out[CA_NEXT_KEY] = self.pending.key_pem
        return out

    @property
    def bundle_pem(self) -> bytes:
        return self.data()[CA_CRT]


def _public(key_or_cert: object) -> bytes:
    public = key_or_cert.public_key()  # type: ignore[attr-defined]
    return bytes(public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))


def _load_key(pem: bytes) -> ec.EllipticCurvePrivateKey | None:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        return None
    return key if isinstance(key, ec.EllipticCurvePrivateKey) else None


def load_bundle(pem: bytes) -> tuple[x509.Certificate, ...]:
    try:
        return tuple(x509.load_pem_x509_certificates(pem))
    except ValueError:
        return ()


def fingerprint(cert: x509.Certificate) -> bytes:
    return cert.fingerprint(hashes.SHA256())


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _pair_for(key_pem: bytes, bundle: Sequence[x509.Certificate]) -> KeyPair | None:
    key = _load_key(key_pem)
    if key is None:
        return None
    for cert in bundle:
        if _public(cert) == _public(key):
            return KeyPair(cert.public_bytes(serialization.Encoding.PEM), key_pem)
    return None


def _serving_problem(data: Mapping[str, bytes], signing: KeyPair, dns_names: Sequence[str]) -> str:
    cert_pem, key_pem = data.get(TLS_CRT, b""), data.get(TLS_KEY, b"")
    if not cert_pem or not key_pem:
        return f"{TLS_CRT} or {TLS_KEY} is missing"
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return f"{TLS_CRT} is not a PEM certificate"
    key = _load_key(key_pem)
    if key is None:
        return f"{TLS_KEY} is not an unencrypted PEM EC private key"
    if _public(cert) != _public(key):
        return f"{TLS_KEY} does not match {TLS_CRT}"
    try:
        cert.verify_directly_issued_by(signing.certificate)
    except Exception:  # InvalidSignature, or a certificate of another key type
        return "the serving certificate is not signed by the current CA"
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName)
    except x509.ExtensionNotFound:
        names = []
    if sorted(names) != sorted(dns_names):
        return f"the serving certificate names {sorted(names)}, not {sorted(dns_names)}"
    return ""


def parse_material(data: Mapping[str, bytes], dns_names: Sequence[str], now: datetime.datetime) -> Material:
    """Parse the Secret's data. Raises CorruptSecret when the CA part is unusable; a bad serving pair
    is reported in `serving_problem` (the CA is kept and a new pair issued)."""
    bundle = load_bundle(data.get(CA_CRT, b""))
    if not bundle:
        raise CorruptSecret(f"{CA_CRT} is missing or holds no PEM certificate")
    if not data.get(CA_KEY):
        raise CorruptSecret(f"{CA_KEY} (the CA's private key) is missing")
    signing = _pair_for(data[CA_KEY], bundle)
    if signing is None:
        raise CorruptSecret(f"{CA_KEY} is not an EC private key of any certificate in {CA_CRT}")
    ca = signing.certificate
    if not _is_ca(ca):
        raise CorruptSecret(f"the certificate of {CA_KEY} is not a CA certificate")
    if ca.not_valid_after_utc <= now:
        raise CorruptSecret(f"the CA expired at {ca.not_valid_after_utc.isoformat()}")
    pending = _pair_for(data[CA_NEXT_KEY], bundle) if data.get(CA_NEXT_KEY) else None
    problem = _serving_problem(data, signing, dns_names)
    serving = None if problem else KeyPair(data[TLS_CRT], data[TLS_KEY])
    # Signing CA first, then the pending one, then the rest in their order.
    first = [signing.certificate] + ([pending.certificate] if pending else [])
    firsts = {fingerprint(c) for c in first}
    ordered = tuple(first) + tuple(c for c in bundle if fingerprint(c) not in firsts)
    return Material(signing=signing, bundle=ordered, pending=pending, serving=serving, serving_problem=problem)


@dataclass(frozen=True)
class Plan:
    material: Material
    annotations: dict[str, str]
    reasons: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.reasons)


def _valid_at(cert: x509.Certificate, now: datetime.datetime) -> bool:
    return cert.not_valid_after_utc > now


def new_ca(settings: Settings, now: datetime.datetime) -> KeyPair:
    name = f"{settings.service_name}.{settings.namespace} webhook CA {now:%Y%m%dT%H%M%S}"
    return make_ca(common_name=name[:64], valid_for=settings.ca_validity)


def _serving_cert(settings: Settings, ca: KeyPair, now: datetime.datetime) -> KeyPair:
    left = ca.certificate.not_valid_after_utc - now
    return make_serving_cert(ca, settings.dns_names, valid_for=min(settings.cert_validity, left))


def fresh_material(settings: Settings, now: datetime.datetime, keep: Sequence[x509.Certificate] = ()) -> Material:
    """A new CA and serving pair; `keep` are CA certificates still worth trusting (not expired)."""
    ca = new_ca(settings, now)
    kept = tuple(c for c in keep if _is_ca(c) and _valid_at(c, now) and _public(c) != _public(ca.certificate))
    return Material(signing=ca, bundle=(ca.certificate, *kept), serving=_serving_cert(settings, ca, now))


def plan(
    material: Material,
    annotations: Mapping[str, str],
    settings: Settings,
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
            pass  # patched below by this reconcile; promoted on a later one
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
    kept = tuple(c for c in m.bundle if _valid_at(c, now))
    if len(kept) != len(m.bundle):
        m = replace(m, bundle=kept)
        reasons.append("expired CA certificates left the bundle")
    # the serving pair
    if m.serving is None:
        reasons.append(f"new serving certificate: {m.serving_problem or 'none yet'}")
        m = replace(m, serving=_serving_cert(settings, m.signing, now), serving_problem="")
    else:
        left = m.serving.certificate.not_valid_after_utc - now
        if left < settings.cert_renew_before:
            until = m.serving.certificate.not_valid_after_utc.isoformat()
            reasons.append(f"the serving certificate expires at {until}, within {settings.cert_renew_before}: renewed")
            m = replace(m, serving=_serving_cert(settings, m.signing, now))
    return Plan(material=m, annotations=notes, reasons=tuple(reasons))


def _parse_time(raw: str | None) -> datetime.datetime | None:
    if not raw:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(raw)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


# --- files ------------------------------------------------------------------------------------------------


def _write_atomic(path: Path, content: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, content)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_pair(settings: Settings, pair: KeyPair) -> bool:
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


def file_readiness(ready_file: Path) -> Callable[[], bool]:
    """The /readyz hook for the app: the master writes the file once the certificate is served and the
    caBundle is in place (gunicorn workers are separate processes, a file is what they all see)."""

    def ready() -> bool:
        return ready_file.exists()

    return ready


# --- the reconcile loop -----------------------------------------------------------------------------------


@dataclass
class Status:
    ready: bool = False
    secret_version: str = ""
    serving_serial: int = 0
    bundle: bytes = b""
    reasons: list[str] = field(default_factory=list)
    error: str = ""


class TlsManager:
    def __init__(self, api: KubeApi, settings: Settings, clock: Callable[[], datetime.datetime] = utcnow) -> None:
        self.api = api
        self.settings = settings
        self.clock = clock
        self.lock = threading.Lock()
        self.status = Status()

    @property
    def where(self) -> str:
        return f"Secret {self.settings.namespace}/{self.settings.secret_name}"

    def _owner(self) -> tuple[dict[str, str], ...]:
        """The ValidatingWebhookConfiguration, else (validation in CEL) the mutating one."""
        kind, name = self.settings.configurations[-1]
        config = self.api.read_webhook_configuration(kind, name)
        if config is None or not config.uid:
            return ()
        return ({"apiVersion": ADMISSION_API_VERSION, "kind": kind, "name": config.name, "uid": config.uid},)

    def _published(self) -> frozenset[bytes]:
        """CA fingerprints present in the caBundle of every webhook of both configurations."""
        common: set[bytes] | None = None
        for kind, name in self.settings.configurations:
            config = self.api.read_webhook_configuration(kind, name)
            if config is None or not config.ca_bundles:
                return frozenset()
            for bundle in config.ca_bundles.values():
                found = {fingerprint(c) for c in load_bundle(bundle)}
                common = found if common is None else common & found
        return frozenset(common or ())

    def _secret(self, material: Material, annotations: Mapping[str, str], base: SecretObject | None,
                owner: tuple[dict[str, str], ...]) -> SecretObject:
        labels = {**(dict(base.labels) if base else {}), **LABELS}
        owners = tuple(base.owner_references) if base and base.owner_references else owner
        return SecretObject(
            namespace=self.settings.namespace, name=self.settings.secret_name, data=material.data(),
            labels=labels, annotations=dict(annotations), owner_references=owners,
            resource_version=base.resource_version if base else "",
        )

    def ensure_secret(self) -> tuple[SecretObject, Material]:
        """Read, create or update the Secret until it holds usable material; returns both."""
        settings, where = self.settings, self.where
        owner = self._owner()
        published = self._published()
        for _ in range(MAX_ATTEMPTS):
            now = self.clock()
            secret = self.api.read_secret(settings.namespace, settings.secret_name)
            if secret is None:
                material = fresh_material(settings, now)
                try:
                    created = self.api.create_secret(self._secret(material, {}, None, owner))
                except AlreadyExists:
                    log.info("%s was created by another replica meanwhile; using it", where)
                    continue
                log.info("created %s with a new CA and serving certificate", where)
                self.status.reasons.append("created")
                return created, material
            annotations = dict(secret.annotations)
            try:
                if secret.type != "kubernetes.io/tls":
                    raise KubeError(0, "WrongType", f"{where} has type {secret.type}, not kubernetes.io/tls; "
                                    "delete it so the webhook can create its own")
                material = parse_material(secret.data, settings.dns_names, now)
                if material.serving_problem:
                    log.error("%s holds an unusable serving certificate (%s); issuing a new one with the same CA",
                              where, material.serving_problem)
                result = plan(material, annotations, settings, now, published)
                reasons = list(result.reasons)
                material, annotations = result.material, result.annotations
            except CorruptSecret as exc:
                log.error("%s is corrupted (%s); replacing it with a new CA and serving certificate", where, exc)
                material = fresh_material(settings, now, keep=load_bundle(secret.data.get(CA_CRT, b"")))
                annotations.pop(NEXT_ADDED_ANNOTATION, None)
                reasons = [f"corrupted: {exc}"]
            needs_owner = not secret.owner_references and bool(owner)
            if not reasons and not needs_owner:
                return secret, material
            try:
                updated = self.api.replace_secret(self._secret(material, annotations, secret, owner))
            except Conflict:
                log.info("%s changed meanwhile (resourceVersion %s is stale); re-reading", where,
                         secret.resource_version)
                continue
            for reason in reasons:
                log.info("%s updated: %s", where, reason)
            self.status.reasons.extend(reasons)
            return updated, material
        raise KubeError(409, "Conflict", f"{where}: still conflicting after {MAX_ATTEMPTS} attempts")

    def publish_bundle(self, bundle: bytes) -> bool:
        """Set caBundle of every webhook of the two configurations to `bundle`; True when both hold it."""
        ok = True
        for kind, name in self.settings.configurations:
            config = self.api.read_webhook_configuration(kind, name)
            if config is None:
                log.warning("%s %s does not exist (yet); its caBundle is set on a later attempt", kind, name)
                ok = False
                continue
            stale = [hook for hook, current in config.ca_bundles.items() if current != bundle]
            if stale:
                config = self.api.patch_ca_bundle(kind, name, stale, bundle)
                log.info("patched caBundle of %s %s (webhooks %s)", kind, name, ", ".join(stale))
            ok = ok and bool(config.ca_bundles) and all(b == bundle for b in config.ca_bundles.values())
        return ok

    def reconcile(self) -> Status:
        """One pass: Secret, caBundle, files, ready-file. Raises KubeError when the Secret cannot be
        made right (the caller retries); a caBundle problem only keeps the replica unready."""
        with self.lock:
            secret, material = self.ensure_secret()
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
            if published and not ready_file.exists():
                ready_file.write_text("ready\n", encoding="utf-8")
                log.info("TLS ready: certificate served, caBundle in place")
            self.status = Status(ready=ready_file.exists(), secret_version=secret.resource_version,
                                 serving_serial=material.serving.certificate.serial_number, bundle=bundle,
                                 reasons=self.status.reasons)
            return self.status

    def clear_ready(self) -> None:
        self.settings.ready_file.unlink(missing_ok=True)


class Renewer:
    """Background thread (in the gunicorn master): reconcile every `interval` (sooner while unready or
    after an error), with a little jitter so replicas do not all call the apiserver at once."""

    def __init__(self, manager: TlsManager, interval: float, retry: float = 10.0) -> None:
        self.manager = manager
        self.interval = interval
        self.retry = min(retry, interval)
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def _next_wait(self, ok: bool) -> float:
        base = self.interval if ok else self.retry
        return base * random.uniform(0.9, 1.1)  # noqa: S311 - jitter, not crypto

    def run(self) -> None:
        ok = self.manager.status.ready
        while not self.stopped.wait(self._next_wait(ok)):
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
