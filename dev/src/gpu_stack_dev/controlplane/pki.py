"""Certificates and kubeconfigs for the throwaway control plane of hack/controlplane.py.

One CA (ECDSA P-256) signs the API server's serving certificate and the client certificates of the
admin (system:masters), the controller manager and the scheduler; the controller manager also signs CSRs with it.
The service-account token key is separate (RSA, as kube-apiserver's issuer defaults expect).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = datetime.timedelta(days=2)
API_SERVER_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local")


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    controller_manager_cert: Path
    controller_manager_key: Path
    scheduler_cert: Path
    scheduler_key: Path
    sa_key: Path
    sa_pub: Path


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALID_FOR))


def _write(path: Path, data: bytes, mode: int = 0o644) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


def write_pki(directory: Path, loopback: str = "127.0.0.1", service_ip: str = "10.0.0.1",
              node_ips: tuple[str, ...] = ()) -> Pki:
    """The plane's certificates; `node_ips`: further addresses the API server is reached at (a real node's)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("gpu-stack e2e control-plane CA")
    ca_cert = (_builder(ca_name, ca_name, ca_key.public_key())
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))

    def leaf(subject: x509.Name, usage: x509.ObjectIdentifier,
             sans: list[x509.GeneralName] | None = None) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (_builder(subject, ca_name, key.public_key())
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)

    serving = leaf(_name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH,
                   [*(x509.DNSName(n) for n in API_SERVER_NAMES),
                    *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in (loopback, service_ip, *node_ips))])
    admin = leaf(_name("gpu-stack-e2e-admin", "system:masters"), ExtendedKeyUsageOID.CLIENT_AUTH)
    kcm = leaf(_name("system:kube-controller-manager"), ExtendedKeyUsageOID.CLIENT_AUTH)
    # The user the default RBAC binds to system:kube-scheduler (and system:volume-scheduler).
    scheduler = leaf(_name("system:kube-scheduler"), ExtendedKeyUsageOID.CLIENT_AUTH)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    d = directory
    return Pki(
        ca_cert=_write(d / "ca.crt", ca_cert.public_bytes(serialization.Encoding.PEM)),
        ca_key=_write(d / "ca.key", _pem_key(ca_key), 0o600),
        serving_cert=_write(d / "apiserver.crt", serving[0]),
        serving_key=_write(d / "apiserver.key", serving[1], 0o600),
        admin_cert=_write(d / "admin.crt", admin[0]),
        admin_key=_write(d / "admin.key", admin[1], 0o600),
        controller_manager_cert=_write(d / "kcm.crt", kcm[0]),
        controller_manager_key=_write(d / "kcm.key", kcm[1], 0o600),
        scheduler_cert=_write(d / "scheduler.crt", scheduler[0]),
        scheduler_key=_write(d / "scheduler.key", scheduler[1], 0o600),
        sa_key=_write(d / "sa.key", _pem_key(sa_key), 0o600),
        sa_pub=_write(d / "sa.pub", sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)),
    )


def write_kubeconfig(path: Path, server: str, ca_cert: Path, client_cert: Path, client_key: Path, *,
                     user: str = "admin") -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "gpu-stack-e2e", "cluster": {"server": server, "certificate-authority": str(ca_cert)}}],
        "users": [{"name": user, "user": {"client-certificate": str(client_cert), "client-key": str(client_key)}}],
        "contexts": [{"name": "gpu-stack-e2e", "context": {"cluster": "gpu-stack-e2e", "user": user}}],
        "current-context": "gpu-stack-e2e",
    }
    return _write(path, yaml.safe_dump(config, sort_keys=False).encode(), 0o600)


def write_client_cert(pki: Pki, path_stem: Path, common_name: str,
                      organization: str | None = None) -> tuple[Path, Path]:
    """A client certificate signed by the plane's CA (a kubelet's system:node:NAME, kube-proxy's, ...):
    (certificate, key) written as <path_stem>.crt / .key."""
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (_builder(_name(common_name, organization), ca_cert.subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return (_write(path_stem.with_suffix(".crt"), cert.public_bytes(serialization.Encoding.PEM)),
            _write(path_stem.with_suffix(".key"), _pem_key(key), 0o600))
