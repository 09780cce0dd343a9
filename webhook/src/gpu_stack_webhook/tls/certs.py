"""Certificates with `cryptography`: a CA and ECDSA P-256 serving certificates signed by it."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_ca(common_name: str = "gpu-stack-webhook-ca", valid_for: datetime.timedelta | None = None) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + (valid_for or datetime.timedelta(days=3650)))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def make_serving_cert(
    ca: KeyPair,
    dns_names: Iterable[str],
    ip_addresses: Iterable[str] = (),
    valid_for: datetime.timedelta | None = None,
) -> KeyPair:
    """A server certificate (ECDSA P-256) for the given names, signed by `ca`."""
    dns = list(dns_names)
    ca_cert = ca.certificate
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns[0] if dns else "gpu-stack-webhook")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + (valid_for or datetime.timedelta(days=365)))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


@dataclass(frozen=True)
class PkiFiles:
    ca_cert: Path
    cert: Path
    key: Path


def write_loopback_pki(directory: Path, valid_for: datetime.timedelta | None = None) -> PkiFiles:
    """A throwaway CA and a serving certificate for 127.0.0.1 / localhost, written as ca.crt, tls.crt
    and tls.key in `directory`: what the demo, the benchmarks and the tests serve with."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca("gpu-stack loopback CA", valid_for=valid_for)
    serving = make_serving_cert(ca, ["localhost"], ["127.0.0.1"], valid_for=valid_for)
    files = PkiFiles(ca_cert=directory / "ca.crt", cert=directory / "tls.crt", key=directory / "tls.key")
    files.ca_cert.write_bytes(ca.cert_pem)
    files.cert.write_bytes(serving.cert_pem)
    files.key.write_bytes(serving.key_pem)
    files.key.chmod(0o600)
    return files
