#!/usr/bin/env python3
"""Cut a release (CONTRIBUTING.md, "Releasing"); the rules and the files' contents are gpu_stack_dev.release.

    hack/release.py prepare VERSION   set the chart's version and appVersion and the webhook package's
                                      version, turn CHANGELOG's [Unreleased] into [VERSION] (then commit)
    hack/release.py build VERSION [--image IMAGE] [--out DIR] [--no-tag]
                                      check, build into DIR/VERSION, then tag the commit vVERSION

build refuses a working tree with uncommitted changes, a tree whose versions are not VERSION, a CHANGELOG
without the section and an IMAGE whose tag is not VERSION (IMAGE defaults to
ghcr.io/gpu-stack/gpu-stack-webhook:VERSION). It writes:
  gpu-stack-VERSION.tgz                    the chart: its default webhook image is IMAGE, artifacthub annotations
  gpu-stack-webhook-VERSION.oci.tar        the image as an OCI archive (hack/build-image.sh; PYTHON_IMAGE and
  gpu-stack-webhook-VERSION.digest         CA_BUNDLE pass through) and its manifest digest
  gpu_stack_webhook-VERSION-py3-none-any.whl   the webhook package, interpreted build: `pipx install` it for
                                           `kubectl gpu-stack`
  kubectl-gpu_stack-VERSION.tar.gz, gpu-stack.yaml   the krew plugin archive and its manifest
  SHA256SUMS                               `sha256sum -c SHA256SUMS` checks every file above
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import yaml
from gpu_stack_dev import release as rel

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "gpu-stack"
CHART_YAML, PYPROJECT, CHANGELOG = CHART / "Chart.yaml", ROOT / "webhook" / "pyproject.toml", ROOT / "CHANGELOG.md"
PACKAGE_INIT = ROOT / "webhook" / "src" / "gpu_stack_webhook" / "__init__.py"
DEFAULT_REPOSITORY = "ghcr.io/gpu-stack/gpu-stack-webhook"
DOWNLOADS = "https://github.com/gpu-stack/gpu-stack/releases/download"
HOME = "https://github.com/gpu-stack/gpu-stack"
LAUNCHER = """#!/bin/sh
# kubectl gpu-stack: the gpu_stack_webhook wheel beside this file, run by pipx (installed into its cache once).
set -e
here="$(dirname "$(readlink -f "$0")")"
exec pipx run --spec "$here/{wheel}" kubectl-gpu_stack "$@"
"""


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout


def check_clean_tree() -> None:
    changed = git("status", "--porcelain", "--untracked-files=normal").splitlines()
    if changed:
        shown = ", ".join(line[3:] for line in changed[:5]) + (", ..." if len(changed) > 5 else "")
        raise rel.ReleaseError(f"the working tree has uncommitted changes ({shown}): a release is built from a "
                               "commit and tagged; commit or stash them first")


def check_tag_free(version: str) -> None:
    tagged = git("tag", "--list", f"v{version}").strip()
    if tagged and git("rev-list", "-n1", f"v{version}").strip() != git("rev-parse", "HEAD").strip():
        raise rel.ReleaseError(f"the tag v{version} already names another commit")


def build_image(image: str, archive: Path) -> str:
    env = {**os.environ, "IMAGE_ARCHIVE": str(archive), "IMAGE_ARCHIVE_FORMAT": "oci-archive"}
    subprocess.run([str(ROOT / "hack" / "build-image.sh"), image], check=True, env=env)
    return rel.oci_archive_digest(archive)


def package_chart(out: Path, version: str, repository: str, digest: str, helm: str) -> Path:
    values_text = (CHART / "values.yaml").read_text()
    changes = rel.artifacthub_changes(rel.changelog_section(CHANGELOG.read_text(), version))
    annotations = rel.artifacthub_annotations(yaml.safe_load(values_text), f"{repository}:{version}@{digest}",
                                              version, changes, "Apache-2.0")
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "gpu-stack"
        shutil.copytree(CHART, staged, symlinks=True)
        (staged / "values.yaml").write_text(rel.released_values(values_text, repository))
        (staged / "Chart.yaml").write_text(rel.released_chart_yaml(CHART_YAML.read_text(), annotations))
        subprocess.run([helm, "package", str(staged), "--destination", str(out)], check=True,
                       stdout=subprocess.DEVNULL)
    return out / f"gpu-stack-{version}.tgz"


def build_wheel(out: Path, version: str) -> Path:
    with tempfile.TemporaryDirectory() as tmp:  # a copy: pip writes build/ and *.egg-info beside the sources
        source = Path(tmp) / "webhook"
        shutil.copytree(ROOT / "webhook", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        env = {**os.environ, "GPU_STACK_WEBHOOK_PURE_PYTHON": "1"}
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        "--wheel-dir", str(out), str(source)], check=True, env=env)
    (wheel,) = out.glob(f"gpu_stack_webhook-{version}-*.whl")
    return wheel


def krew_plugin(out: Path, version: str, wheel: Path) -> tuple[Path, Path]:
    archive = out / f"kubectl-gpu_stack-{version}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(wheel, arcname=wheel.name)
        tar.add(ROOT / "LICENSE", arcname="LICENSE")
        launcher = LAUNCHER.replace("{wheel}", wheel.name).encode()
        info = tarfile.TarInfo(rel.PLUGIN_BINARY)
        info.size, info.mode = len(launcher), 0o755
        tar.addfile(info, io.BytesIO(launcher))
    manifest = rel.krew_manifest(version, f"{DOWNLOADS}/v{version}/{archive.name}", rel.sha256_file(archive), HOME)
    path = out / f"{rel.KREW_PLUGIN}.yaml"
    path.write_text(yaml.safe_dump(manifest, sort_keys=False, width=1000))
    return archive, path


def build(version: str, image: str | None, out_root: Path, tag: bool, helm: str) -> Path:
    rel.check_version(version)
    repository = rel.check_image_tag(image or f"{DEFAULT_REPOSITORY}:{version}", version)
    check_clean_tree()
    versions = rel.tree_versions(CHART_YAML.read_text(), PYPROJECT.read_text(), PACKAGE_INIT.read_text())
    rel.check_tree_versions(versions, version)
    rel.changelog_section(CHANGELOG.read_text(), version)
    check_tag_free(version)
    out = out_root / version
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    digest = build_image(f"{repository}:{version}", out / f"gpu-stack-webhook-{version}.oci.tar")
    (out / f"gpu-stack-webhook-{version}.digest").write_text(digest + "\n")
    package_chart(out, version, repository, digest, helm)
    wheel = build_wheel(out, version)
    krew_plugin(out, version, wheel)
    (out / "SHA256SUMS").write_text(rel.sha256sums(p for p in out.iterdir() if p.name != "SHA256SUMS"))
    if tag:
        git("tag", "-a", f"v{version}", "-m", f"gpu-stack {version}")
    return out


def prepare(version: str) -> None:
    rel.check_version(version)
    chart, project, package = rel.set_versions(CHART_YAML.read_text(), PYPROJECT.read_text(),
                                               PACKAGE_INIT.read_text(), version)
    changelog = rel.start_changelog_section(CHANGELOG.read_text(), version, datetime.date.today().isoformat())
    CHART_YAML.write_text(chart)
    PYPROJECT.write_text(project)
    PACKAGE_INIT.write_text(package)
    CHANGELOG.write_text(changelog)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare").add_argument("version")
    b = sub.add_parser("build")
    b.add_argument("version")
    b.add_argument("--image", default=None)
    b.add_argument("--out", type=Path, default=ROOT / "dist")
    b.add_argument("--no-tag", dest="tag", action="store_false")
    b.add_argument("--helm", default=os.environ.get("HELM", "helm"))
    args = parser.parse_args()
    try:
        if args.command == "prepare":
            prepare(args.version)
            print(f"release: versions set to {args.version} and CHANGELOG section started: review, commit, then "
                  f"make release VERSION={args.version}")
        else:
            out = build(args.version, args.image, args.out, args.tag, args.helm)
            print(f"release: {args.version} in {out}" + (f", tagged v{args.version}" if args.tag else ""))
    except rel.ReleaseError as e:
        print(f"release: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
