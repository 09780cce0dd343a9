"""gpu_stack_dev.registry without a registry running: what it tells skopeo, containerd and the kubelet.
The registry itself, TLS and auth, is exercised by tests/e2e/node/test_registry.py."""

from __future__ import annotations

import base64
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

from gpu_stack_dev.registry import Registry, archive_transport


def tarball(path: Path, *names: str) -> Path:
    with tarfile.open(path, "w") as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
    return path


def test_the_transport_follows_the_archive(tmp_path: Path) -> None:
    assert archive_transport(tarball(tmp_path / "a.tar", "oci-layout", "index.json", "blobs/sha256/x")) == \
        "oci-archive"
    assert archive_transport(tarball(tmp_path / "b.tar", "manifest.json", "abc/layer.tar")) == "docker-archive"
    # docker save >= 25 writes both: its manifest.json is what docker-archive reads
    assert archive_transport(tarball(tmp_path / "c.tar", "index.json", "manifest.json", "oci-layout")) == \
        "docker-archive"


def test_the_pull_secret_holds_the_login_for_this_host_only(tmp_path: Path) -> None:
    registry = Registry(tmp_path, host_ip="10.77.0.1")
    config = json.loads(registry.docker_config_json())
    assert list(config["auths"]) == ["10.77.0.1:5443"]
    entry = config["auths"]["10.77.0.1:5443"]
    assert base64.b64decode(entry["auth"]).decode() == f"{registry.username}:{registry.password}"
    wrong = json.loads(registry.docker_config_json("not-it"))["auths"]["10.77.0.1:5443"]
    assert base64.b64decode(wrong["auth"]).decode() == f"{registry.username}:not-it"


@dataclass
class FakeNode:
    registry_config_dir: Path


def test_containerd_trusts_the_ca_for_this_host_only(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "registry", host_ip="10.77.0.1")
    registry.certs.mkdir(parents=True)
    registry.ca_cert.write_text("-----BEGIN CERTIFICATE-----\n")
    hosts = registry.trust_from(FakeNode(tmp_path / "certs.d"))
    assert hosts == tmp_path / "certs.d" / "10.77.0.1:5443" / "hosts.toml"
    assert hosts.read_text() == (
        'server = "https://10.77.0.1:5443"\n\n[host."https://10.77.0.1:5443"]\n'
        f'  capabilities = ["pull", "resolve"]\n  ca = "{hosts.parent / "ca.crt"}"\n')
    assert (hosts.parent / "ca.crt").read_text() == "-----BEGIN CERTIFICATE-----\n"
