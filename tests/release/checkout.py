"""A throwaway checkout to cut releases in: the files `hack/release.py` reads, committed in a git repository
of its own, and a PATH whose only image engine is a fake buildah that writes a small OCI archive (its
manifest digest depends on the image name, so two versions get two digests)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COPIED = ("hack/release.py", "hack/build-image.sh", "charts/gpu-stack", "webhook", "CHANGELOG.md", "LICENSE",
          "dev/pyproject.toml", "README.md", "docs/real-node.md")
FAKE_BUILDAH = f"""#!{sys.executable}
import hashlib, io, json, sys, tarfile
args = sys.argv[1:]
if args[:1] == ["push"]:
    transport, path, name = args[-1].split(":", 2)
    assert transport == "oci-archive", transport
    digest = "sha256:" + hashlib.sha256(name.encode()).hexdigest()
    index = json.dumps({{"schemaVersion": 2, "manifests": [
        {{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": 1,
          "annotations": {{"org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]}}}}]}}).encode()
    with tarfile.open(path, "w") as tar:
        for member, data in (("oci-layout", b'{{"imageLayoutVersion": "1.0.0"}}'), ("index.json", index)):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
"""


# `make release-publish` without a registry: skopeo `copy` records its arguments, `inspect` answers a digest of
# its own for the reference (as a registry that recompressed the layers would: not the archive's).
FAKE_SKOPEO = f"""#!{sys.executable}
import hashlib, json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_REGISTRY_LOG"], "a") as log:
    log.write(json.dumps(["skopeo", *args]) + "\\n")
if args[0] == "inspect":
    print("sha256:" + hashlib.sha256(("registry " + args[-1]).encode()).hexdigest())
"""
# helm as it is, but `push` only records its arguments
FAKE_HELM = f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
if args[:1] == ["push"]:
    with open(os.environ["FAKE_REGISTRY_LOG"], "a") as log:
        log.write(json.dumps(["helm", *args]) + "\\n")
    sys.exit(0)
os.execv(os.environ["REAL_HELM"], [os.environ["REAL_HELM"], *args])
"""


def registry_fakes(where: Path, helm: str) -> tuple[str, dict[str, str], Path]:
    """(PATH, environment, the log) for `hack/release.py publish` against FAKE_SKOPEO and FAKE_HELM."""
    path = engine_path(where)
    fakes, log = where / "fakes", where / "registry.log"
    for name, text in (("skopeo", FAKE_SKOPEO), ("helm", FAKE_HELM)):
        (fakes / name).write_text(text)
        (fakes / name).chmod(0o755)
    return path, {"FAKE_REGISTRY_LOG": str(log), "REAL_HELM": helm}, log


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def make_checkout(where: Path) -> Path:
    repo = where / "checkout"
    for relative in COPIED:
        source, target = ROOT / relative, repo / relative
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True,
                            ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    (repo / ".gitignore").write_text("dist/\n")
    git(repo, "init", "--quiet", "--initial-branch=main")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "add", "-A")
    commit(repo, "the checkout")
    return repo


def commit(repo: Path, message: str) -> None:
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "--quiet", "-am", message)


def engine_path(where: Path) -> str:
    """PATH: the fake buildah first (no docker or podman found before it), then the system's tools."""
    fakes = where / "fakes"
    fakes.mkdir(exist_ok=True)
    (fakes / "buildah").write_text(FAKE_BUILDAH)
    (fakes / "buildah").chmod(0o755)
    for absent in ("docker", "podman"):
        (fakes / absent).write_text("#!/bin/sh\necho 'cannot connect' >&2\nexit 1\n")
        (fakes / absent).chmod(0o755)
    return f"{fakes}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def run_release(repo: Path, path: str, *args: str, helm: str = "helm",
                extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**(extra_env or {}), "PATH": path, "HOME": str(repo.parent), "HELM": helm,
           "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    return subprocess.run([sys.executable, str(repo / "hack" / "release.py"), *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


PREBUILT_BUILDAH = f"""#!{sys.executable}
# `buildah bud -t IMAGE` stands for a build: the already built SOURCE image, labelled with IMAGE's tag (so
# each version has a digest of its own), committed as IMAGE. Everything else is the real buildah.
import os, subprocess, sys
real, source = os.environ["REAL_BUILDAH"], os.environ["PREBUILT_IMAGE"]
args = sys.argv[1:]
if args[:1] == ["bud"]:
    image = args[args.index("-t") + 1]
    container = subprocess.run([real, "from", "--quiet", source], check=True,
                               capture_output=True, text=True).stdout.strip()
    try:
        subprocess.run([real, "config", "--label", "org.opencontainers.image.version=" + image.rsplit(":", 1)[1],
                        container], check=True)
        subprocess.run([real, "commit", "--quiet", container, image], check=True, stdout=subprocess.DEVNULL)
    finally:
        subprocess.run([real, "rm", container], check=True, stdout=subprocess.DEVNULL)
    sys.exit(0)
os.execv(real, [real, *args])
"""


def prebuilt_engine_path(where: Path, source_image: str) -> tuple[str, dict[str, str]]:
    """(PATH, environment) for `hack/release.py build` that takes the image `make e2e-image` built instead of
    building it again (the same Dockerfile; minutes saved): `make e2e` releases it into its registry.
    `source_image` is any reference buildah reads, e.g. docker-archive:<the archive e2e-image wrote>, which
    every engine writes."""
    real = shutil.which("buildah")
    assert real, "buildah is not installed (hack/ensure-node.sh)"
    path = engine_path(where)
    (where / "fakes" / "buildah").write_text(PREBUILT_BUILDAH)
    return path, {"REAL_BUILDAH": real, "PREBUILT_IMAGE": source_image}
