"""What the TLS Secret holds, parsed and built: the signing CA, the trust bundle, a pending CA during a
rotation, and the serving pair. Parsing says precisely what is wrong with a damaged Secret; building makes
a new CA and serving certificate for the settings. No I/O (certificates are generated in memory)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpu_stack_webhook.tls.certs import KeyPair, make_ca, make_serving_cert
from gpu_stack_webhook.tls.config import CA_CRT, CA_KEY, CA_NEXT_KEY, TLS_CRT, TLS_KEY, SelfManagedTls


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


def valid_at(cert: x509.Certificate, now: datetime.datetime) -> bool:
    return cert.not_valid_after_utc > now


def new_ca(settings: SelfManagedTls, now: datetime.datetime) -> KeyPair:
    name = f"{settings.service_name}.{settings.namespace} webhook CA {now:%Y%m%dT%H%M%S}"
    return make_ca(common_name=name[:64], valid_for=settings.ca_validity)


def serving_cert(settings: SelfManagedTls, ca: KeyPair, now: datetime.datetime) -> KeyPair:
    left = ca.certificate.not_valid_after_utc - now
    return make_serving_cert(ca, settings.dns_names, valid_for=min(settings.cert_validity, left))


def fresh_material(settings: SelfManagedTls, now: datetime.datetime, keep: Sequence[x509.Certificate] = ()) -> Material:
    """A new CA and serving pair; `keep` are CA certificates still worth trusting (not expired)."""
    ca = new_ca(settings, now)
    kept = tuple(c for c in keep if _is_ca(c) and valid_at(c, now) and _public(c) != _public(ca.certificate))
    return Material(signing=ca, bundle=(ca.certificate, *kept), serving=serving_cert(settings, ca, now))


