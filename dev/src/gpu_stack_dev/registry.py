"""A real OCI registry on the node's network, as users' clusters pull from: Debian's docker-registry
(distribution v2.8) over TLS with a CA of its own and htpasswd (bcrypt) auth, listening on the node's address.

    with registry.Registry(workdir, host_ip=node.NODE_IP) as reg:
        reg.trust_from(real_node)                     # containerd's hosts.toml: the CA, for this host only
        digest = reg.push_archive(archive, "gpu-stack/gpu-stack-webhook", "0.2.0")  # any docker/OCI archive
        reg.push_chart(package, helm)                 # helm push ... oci://<host>/charts
        reg.login_helm(helm)                          # then `hack/release.py publish` with HELM_REGISTRY_CONFIG
        reg.digest("gpu-stack/gpu-stack-webhook", "0.2.0")  # what the registry serves (skopeo inspect)
        reg.pull_secret(cluster, namespace)           # a kubernetes.io/dockerconfigjson Secret

`push_archive` takes what `ctr images import` takes (a docker-archive or an OCI archive), so any image the
node tests build can be served from here instead (skopeo copy; the digest it returns is the one pulled).
Processes are stopped by pid; everything lives under `workdir`.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import secrets
import subprocess
import time
from pathlib import Path
from typing import Protocol

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpu_stack_dev.release import archive_transport

__all__ = ["Registry", "RegistryError", "archive_transport"]

PORT = 5443
USER = "gpu-stack-e2e"
DEBIAN_PACKAGES = ("docker-registry", "skopeo", "apache2-utils")
TOOLS = ("docker-registry", "skopeo", "htpasswd")


class RegistryError(RuntimeError):
    pass


class HasRegistryConfig(Protocol):
    registry_config_dir: Path


class Kubectl(Protocol):
    def kubectl(self, *args: str, input: str | None = None, timeout: float = ...) -> object: ...


def _cert(subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, signer: ec.EllipticCurvePrivateKey,
          *, ca: bool, ip: str | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ip:
        builder = (builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
                                         critical=False)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
    return builder.sign(signer, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class Registry:
    def __init__(self, workdir: Path, *, host_ip: str, port: int = PORT) -> None:
        self.dir = workdir
        self.host = f"{host_ip}:{port}"
        self.username, self.password = USER, secrets.token_urlsafe(16)
        self.certs = workdir / "certs"  # skopeo's --dest-cert-dir: ca.crt
        self.ca_cert = self.certs / "ca.crt"
        self.helm_registry_config = workdir / "helm-registry.json"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Registry:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.certs.mkdir(exist_ok=True)
        ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        ca = _cert("gpu-stack e2e registry CA", x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                                                "gpu-stack e2e registry CA")]),
                   ca_key, ca_key, ca=True)
        serving = _cert("gpu-stack e2e registry", ca.subject, key, ca_key, ca=False, ip=self.host.split(":")[0])
        self.ca_cert.write_bytes(_pem(ca))
        (self.dir / "tls.crt").write_bytes(_pem(serving) + _pem(ca))
        (self.dir / "tls.key").write_bytes(_key(key))
        htpasswd = subprocess.run(["htpasswd", "-Bbn", self.username, self.password], check=True,
                                  capture_output=True, text=True).stdout
        (self.dir / "htpasswd").write_text(htpasswd)
        config = {"version": 0.1, "log": {"level": "warn"},
                  "storage": {"filesystem": {"rootdirectory": str(self.dir / "data")}, "delete": {"enabled": True}},
                  "http": {"addr": self.host, "tls": {"certificate": str(self.dir / "tls.crt"),
                                                      "key": str(self.dir / "tls.key")}},
                  "auth": {"htpasswd": {"realm": "gpu-stack-e2e", "path": str(self.dir / "htpasswd")}}}
        (self.dir / "config.yml").write_text(json.dumps(config))  # YAML is a superset of JSON
        with (self.dir / "registry.log").open("ab") as log:
            self.proc = subprocess.Popen(["docker-registry", "serve", str(self.dir / "config.yml")], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            # /v2/ answers 401 to a client without credentials once the registry serves
            probe = subprocess.run(["skopeo", "inspect", "--cert-dir", str(self.certs), "--no-creds",
                                    f"docker://{self.host}/ready/probe:none"], capture_output=True, text=True,
                                   check=False)
            if "unauthorized" in probe.stderr.lower() or "authentication required" in probe.stderr.lower():
                return
            if self.proc is None or self.proc.poll() is not None or time.monotonic() > deadline:
                log = (self.dir / "registry.log").read_text(errors="replace")[-2000:]
                raise RegistryError(f"the registry did not start on {self.host}: {probe.stderr.strip()}\n{log}")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        self.proc = None

    # --- what clients do ---------------------------------------------------------------------------------
    def push_archive(self, archive: Path, repository: str, tag: str) -> str:
        """Copy an image tarball to <host>/<repository>:<tag>; returns the manifest digest the registry serves.
        Uncompressed layers (a docker-archive's) are gzipped at level 1: about twice as fast as the default on
        these machines, and what a test waits for is the push, not the size."""
        digest_file = self.dir / f"digest-{repository.replace('/', '_')}-{tag}"
        subprocess.run(["skopeo", "copy", "--quiet", "--dest-cert-dir", str(self.certs), "--dest-creds",
                        f"{self.username}:{self.password}", "--digestfile", str(digest_file),
                        "--dest-compress-level", "1",
                        f"{archive_transport(archive)}:{archive}", f"docker://{self.host}/{repository}:{tag}"],
                       check=True, capture_output=True, text=True)
        return digest_file.read_text().strip()

    def helm_flags(self) -> list[str]:
        """What helm needs to reach this registry: its CA and the login `push_chart` stored."""
        return ["--registry-config", str(self.helm_registry_config), "--ca-file", str(self.ca_cert)]

    def login_helm(self, helm: str) -> Path:
        """`helm registry login` into helm_registry_config, which is also a containers auth file (the same
        format): what `make release-publish` uses for helm and skopeo (HELM_REGISTRY_CONFIG)."""
        subprocess.run([helm, "registry", "login", self.host, "--username", self.username, "--password-stdin",
                        *self.helm_flags()], input=self.password, check=True, capture_output=True, text=True)
        return self.helm_registry_config

    def push_chart(self, package: Path, helm: str, project: str = "charts") -> str:
        """`helm push` the package to oci://<host>/<project>; returns the chart's oci:// reference."""
        self.login_helm(helm)
        subprocess.run([helm, "push", str(package), f"oci://{self.host}/{project}", *self.helm_flags()],
                       check=True, capture_output=True, text=True)
        return f"oci://{self.host}/{project}/{package.name.rsplit('-', 1)[0]}"

    def digest(self, repository: str, tag: str) -> str:
        """The manifest digest the registry serves for <repository>:<tag> (skopeo inspect)."""
        return subprocess.run(["skopeo", "inspect", "--no-tags", "--cert-dir", str(self.certs), "--creds",
                               f"{self.username}:{self.password}", "--format", "{{.Digest}}",
                               f"docker://{self.host}/{repository}:{tag}"],
                              check=True, capture_output=True, text=True).stdout.strip()

    def docker_config_json(self, password: str | None = None) -> str:
        auth = base64.b64encode(f"{self.username}:{password or self.password}".encode()).decode()
        return json.dumps({"auths": {self.host: {"username": self.username, "password": password or self.password,
                                                 "auth": auth}}})

    def pull_secret(self, cluster: Kubectl, namespace: str, name: str = "registry-pull",
                    password: str | None = None) -> str:
        """A kubernetes.io/dockerconfigjson Secret for this registry (another `password`: a wrong secret)."""
        secret = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
                  "metadata": {"name": name, "namespace": namespace},
                  "data": {".dockerconfigjson": base64.b64encode(self.docker_config_json(password).encode()).decode()}}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(secret))
        return name

    def trust_from(self, node: HasRegistryConfig) -> Path:
        """containerd's hosts.toml for this registry (config_path, containerd 1.6 docs/hosts.md): its CA, this
        host only. containerd reads it at each pull: no restart."""
        hosts = node.registry_config_dir / self.host
        hosts.mkdir(parents=True, exist_ok=True)
        (hosts / "ca.crt").write_bytes(self.ca_cert.read_bytes())
        (hosts / "hosts.toml").write_text(f'server = "https://{self.host}"\n\n[host."https://{self.host}"]\n'
                                          f'  capabilities = ["pull", "resolve"]\n  ca = "{hosts / "ca.crt"}"\n')
        return hosts / "hosts.toml"
