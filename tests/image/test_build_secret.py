"""The CA bundle build secret with a real engine: buildah (`--secret id=ca_bundle,src=...`, what
hack/build-image.sh passes every engine) and the mount line webhook/Dockerfile's downloading steps carry, on a
two-file image: the step sees the bundle in place of the base's, no layer keeps it, and without the secret
the step sees the base's. `make e2e-image` builds the webhook image itself this way."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.require import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
BUSYBOX = Path("/bin/busybox")
BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def dockerfile_mount() -> str:
    (mount,) = set(re.findall(r"RUN (--mount=type=secret,id=ca_bundle,\S+)", (ROOT / "webhook/Dockerfile").read_text()))
    return mount


@pytest.fixture
def buildah() -> str:
    found = shutil.which("buildah")
    if not found or os.geteuid() != 0 or not BUSYBOX.is_file():
        skip_or_fail("needs root, buildah and busybox-static (hack/ensure-node.sh)")
    return found


@pytest.fixture
def context(tmp_path: Path) -> Path:
    shutil.copy2(BUSYBOX, tmp_path / "busybox")
    (tmp_path / "base-bundle").write_text("the base's own bundle\n")
    (tmp_path / "Containerfile").write_text(
        "FROM scratch\nCOPY busybox /bin/busybox\nCOPY base-bundle /etc/ssl/certs/ca-certificates.crt\n"
        f'RUN {dockerfile_mount()} ["/bin/busybox", "cp", "{BUNDLE}", "/seen-by-the-step"]\n')
    return tmp_path


def build(buildah: str, context: Path, tag: str, *secret: str) -> Iterator[Path]:
    env = {**os.environ, "BUILDAH_ISOLATION": "chroot"}
    built = subprocess.run([buildah, "bud", "--quiet", "--layers=false", *secret, "-t", tag, str(context)],
                           env=env, capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr
    container = subprocess.run([buildah, "from", "--pull-never", "--quiet", tag], check=True, capture_output=True,
                               text=True).stdout.strip()
    try:
        yield Path(subprocess.run([buildah, "mount", container], check=True, capture_output=True,
                                  text=True).stdout.strip())
    finally:
        subprocess.run([buildah, "rm", container], check=False, capture_output=True)
        subprocess.run([buildah, "rmi", tag], check=False, capture_output=True)


def test_the_step_trusts_the_secret_and_no_layer_keeps_it(buildah: str, context: Path) -> None:
    secret = context.parent / f"{context.name}-proxy-ca.crt"
    secret.write_text("-----BEGIN CERTIFICATE-----\nthe proxy's CA\n")
    for rootfs in build(buildah, context, "localhost/gpu-stack-secret-test:with", "--secret",
                        f"id=ca_bundle,src={secret}"):
        assert (rootfs / "seen-by-the-step").read_text() == secret.read_text()
        # no layer keeps the secret (buildah 1.28 removes the mount target after the step, the base's file
        # with it: only the build stage loses it, the runtime stage starts from the base again)
        holding = [f.name for f in rootfs.rglob("*")
                   if f.is_file() and "the proxy's CA" in f.read_text(errors="replace")]
        assert holding == ["seen-by-the-step"]


def test_without_the_secret_the_step_uses_the_base_bundle(buildah: str, context: Path) -> None:
    for rootfs in build(buildah, context, "localhost/gpu-stack-secret-test:without"):
        assert (rootfs / "seen-by-the-step").read_text() == "the base's own bundle\n"
