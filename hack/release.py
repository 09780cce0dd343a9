#!/usr/bin/env python3
"""Cut a release (CONTRIBUTING.md, "Releasing"); the rules and the files' contents are gpu_stack_dev.release.

    hack/release.py prepare VERSION   set the chart's version and appVersion, the webhook and dev packages'
                                      versions and the documents' examples (gpu-stack-webhook:VERSION), turn
                                      CHANGELOG's [Unreleased] into [VERSION] (then commit)
    hack/release.py build VERSION [--image IMAGE] [--out DIR] [--no-tag]
                                      check, build into DIR/VERSION, then tag the commit vVERSION
    hack/release.py publish VERSION --registry REGISTRY [--out DIR] [--ca-file FILE]
                                      push DIR/VERSION's image to REGISTRY/gpu-stack-webhook:VERSION, read its
                                      digest back from the registry, write it into the chart package (the
                                      image pinned by digest) and the .digest file, then push the chart to
                                      oci://REGISTRY/charts

build refuses a VERSION that is not SemVer, an IMAGE whose tag is not VERSION (IMAGE defaults to
ghcr.io/gpu-stack/gpu-stack-webhook:VERSION), a working tree with uncommitted changes, a tree whose versions
are not VERSION, a CHANGELOG without the section and a tag vVERSION on another commit, all before it builds
anything. Run again for a version tagged on this commit, it finishes without building when DIR/VERSION holds
the files SHA256SUMS lists and stops when it holds anything else; it builds in DIR/.VERSION.partial and
replaces DIR/VERSION only once everything is built. It writes:
  gpu-stack-VERSION.tgz                    the chart: its default webhook image is IMAGE, artifacthub annotations
  gpu-stack-webhook-VERSION.oci.tar        the image as an OCI archive (hack/build-image.sh; PYTHON_IMAGE and
                                           CA_BUNDLE pass through; docker writes its `docker save` archive)
  gpu_stack_webhook-VERSION-py3-none-any.whl   the webhook package, interpreted build: `pipx install` it for
                                           `kubectl gpu-stack`
  kubectl-gpu_stack-VERSION.tar.gz, gpu-stack.yaml   the krew plugin archive and its manifest
  SHA256SUMS                               `sha256sum -c SHA256SUMS` checks every file above

No digest is written offline: a registry may store another manifest than the archive's (skopeo compresses a
docker-archive's layers on the push), so publish takes the digest the registry serves (skopeo inspect) and
adds gpu-stack-webhook-VERSION.digest, repackages the chart with webhook.image.repository and .digest set to
the pushed image, and rewrites SHA256SUMS. Credentials: helm's registry config (`helm registry login`,
HELM_REGISTRY_CONFIG), which skopeo reads as its auth file too.
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
DEV_PYPROJECT = ROOT / "dev" / "pyproject.toml"
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


def tagged_here(version: str) -> bool:
    """True when vVERSION tags HEAD; ReleaseError when it tags another commit."""
    if not git("tag", "--list", f"v{version}").strip():
        return False
    if git("rev-list", "-n1", f"v{version}").strip() != git("rev-parse", "HEAD").strip():
        raise rel.ReleaseError(f"the tag v{version} already names another commit")
    return True


def documents() -> dict[str, str]:
    return {path: (ROOT / path).read_text() for path in rel.EXAMPLE_DOCUMENTS if (ROOT / path).is_file()}


def build_image(image: str, archive: Path) -> None:
    env = {**os.environ, "IMAGE_ARCHIVE": str(archive), "IMAGE_ARCHIVE_FORMAT": "oci-archive"}
    subprocess.run([str(ROOT / "hack" / "build-image.sh"), image], check=True, env=env)


def package_chart(out: Path, version: str, repository: str, helm: str) -> Path:
    values_text = (CHART / "values.yaml").read_text()
    changes = rel.artifacthub_changes(rel.changelog_section(CHANGELOG.read_text(), version))
    annotations = rel.artifacthub_annotations(yaml.safe_load(values_text), rel.webhook_image_ref(repository, version),
                                              version, changes, "Apache-2.0")
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "gpu-stack"
        shutil.copytree(CHART, staged, symlinks=True)
        (staged / "values.yaml").write_text(rel.released_values(values_text, repository))
        (staged / "Chart.yaml").write_text(rel.released_chart_yaml(CHART_YAML.read_text(), annotations))
        subprocess.run([helm, "package", str(staged), "--destination", str(out)], check=True,
                       stdout=subprocess.DEVNULL)
    return out / f"gpu-stack-{version}.tgz"


def pin_chart(package: Path, repository: str, version: str, digest: str, helm: str) -> None:
    """The packaged chart again, its webhook image `repository@digest` by default (values and the
    artifacthub.io/images annotation): what the registry serves."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(package) as tar:
            tar.extractall(tmp, filter="data")
        staged = Path(tmp) / "gpu-stack"
        values = staged / "values.yaml"
        values.write_text(rel.released_values(values.read_text(), repository, digest))
        chart = yaml.safe_load((staged / "Chart.yaml").read_text())
        images = yaml.safe_load(chart["annotations"]["artifacthub.io/images"])
        images = [{**i, "image": rel.webhook_image_ref(repository, version, digest)}
                  if i["name"] == rel.WEBHOOK_IMAGE_NAME else i for i in images]
        annotations = {"artifacthub.io/images": yaml.safe_dump(images, sort_keys=False)}
        (staged / "Chart.yaml").write_text(rel.released_chart_yaml((staged / "Chart.yaml").read_text(), annotations))
        out = Path(tmp) / "out"
        subprocess.run([helm, "package", str(staged), "--destination", str(out)], check=True,
                       stdout=subprocess.DEVNULL)
        shutil.move(out / package.name, package)


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


def build(version: str, image: str | None, out_root: Path, tag: bool, helm: str) -> tuple[Path, str]:
    """Check everything, then build into out_root/.VERSION.partial and move it to out_root/VERSION; (that
    directory, what was done)."""
    rel.check_version(version)
    repository = rel.check_image_tag(image or f"{DEFAULT_REPOSITORY}:{version}", version)
    check_clean_tree()
    versions = rel.tree_versions(CHART_YAML.read_text(), PYPROJECT.read_text(), PACKAGE_INIT.read_text(),
                                 DEV_PYPROJECT.read_text(), documents())
    rel.check_tree_versions(versions, version)
    rel.changelog_section(CHANGELOG.read_text(), version)
    already_tagged = tagged_here(version)
    out = out_root / version
    if already_tagged and out.exists():
        problems = rel.read_sha256sums(out)
        if problems:
            raise rel.ReleaseError(f"v{version} tags this commit and {out} is not the release's files "
                                   f"({'; '.join(problems[:3])}): nothing was changed. Remove {out} to build "
                                   "the release again")
        return out, f"already built in {out} and tagged v{version}: nothing to do (remove {out} to build again)"
    partial = out_root / f".{version}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    build_image(f"{repository}:{version}", partial / f"gpu-stack-webhook-{version}.oci.tar")
    package_chart(partial, version, repository, helm)
    wheel = build_wheel(partial, version)
    krew_plugin(partial, version, wheel)
    (partial / "SHA256SUMS").write_text(rel.sha256sums(p for p in partial.iterdir() if p.name != "SHA256SUMS"))
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    if already_tagged:
        return out, f"in {out}, v{version} already tagged this commit"
    if tag:
        git("tag", "-a", f"v{version}", "-m", f"gpu-stack {version}")
        return out, f"in {out}, tagged v{version}"
    return out, f"in {out}"


def helm_registry_config(helm: str) -> str:
    return subprocess.run([helm, "env", "HELM_REGISTRY_CONFIG"], check=True, capture_output=True,
                          text=True).stdout.strip()


def publish(version: str, registry: str, out_root: Path, helm: str, ca_file: Path | None) -> str:
    rel.check_version(version)
    registry = registry.removeprefix("oci://").rstrip("/")
    if not registry:
        raise rel.ReleaseError("REGISTRY is empty: name the registry (and path) to publish to, e.g. "
                               "registry.example.com/gpu-stack")
    out = out_root / version
    if not out.is_dir():
        raise rel.ReleaseError(f"{out} does not exist: `make release VERSION={version}` builds it first")
    problems = rel.read_sha256sums(out)
    if problems:
        raise rel.ReleaseError(f"{out} is not a release's files ({'; '.join(problems[:3])}): build it again "
                               f"with `make release VERSION={version}`")
    archive, package = out / f"gpu-stack-webhook-{version}.oci.tar", out / f"gpu-stack-{version}.tgz"
    repository = f"{registry}/{rel.WEBHOOK_IMAGE_NAME}"
    image = f"{repository}:{version}"
    auth = helm_registry_config(helm)
    with tempfile.TemporaryDirectory() as certs:
        options: dict[str, str] = {}  # skopeo's, --dest-<name> for copy
        if Path(auth).is_file():
            options["authfile"] = auth
        if ca_file is not None:
            shutil.copy(ca_file, Path(certs) / "ca.crt")
            options["cert-dir"] = certs
        helm_tls = ["--ca-file", str(ca_file)] if ca_file is not None else []
        subprocess.run(["skopeo", "copy", "--quiet", *[a for k, v in options.items() for a in (f"--dest-{k}", v)],
                        f"{rel.archive_transport(archive)}:{archive}", f"docker://{image}"], check=True)
        # what users pin is what the registry serves, read back from it, not the archive's own manifest
        digest = rel.check_digest(subprocess.run(
            ["skopeo", "inspect", "--no-tags", *[a for k, v in options.items() for a in (f"--{k}", v)],
             "--format", "{{.Digest}}",
             f"docker://{image}"], check=True, capture_output=True, text=True).stdout.strip(), image)
        pin_chart(package, repository, version, digest, helm)
        (out / f"gpu-stack-webhook-{version}.digest").write_text(digest + "\n")
        (out / "SHA256SUMS").write_text(rel.sha256sums(p for p in out.iterdir() if p.name != "SHA256SUMS"))
        subprocess.run([helm, "push", str(package), f"oci://{registry}/charts", *helm_tls], check=True,
                       stdout=subprocess.DEVNULL)
    return (f"{image}@{digest} and oci://{registry}/charts/gpu-stack {version} (its webhook image pinned to "
            f"that digest); {out} updated: the chart package, gpu-stack-webhook-{version}.digest and SHA256SUMS")


def prepare(version: str) -> None:
    rel.check_version(version)
    chart, project, package = rel.set_versions(CHART_YAML.read_text(), PYPROJECT.read_text(),
                                               PACKAGE_INIT.read_text(), version)
    changelog = rel.start_changelog_section(CHANGELOG.read_text(), version, datetime.date.today().isoformat())
    CHART_YAML.write_text(chart)
    PYPROJECT.write_text(project)
    PACKAGE_INIT.write_text(package)
    DEV_PYPROJECT.write_text(rel.set_project_version(DEV_PYPROJECT.read_text(), version))
    for path, text in documents().items():
        (ROOT / path).write_text(rel.set_example_versions(text, version))
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
    p = sub.add_parser("publish")
    p.add_argument("version")
    p.add_argument("--registry", required=True)
    p.add_argument("--out", type=Path, default=ROOT / "dist")
    p.add_argument("--ca-file", type=Path, default=None)
    p.add_argument("--helm", default=os.environ.get("HELM", "helm"))
    args = parser.parse_args()
    try:
        if args.command == "prepare":
            prepare(args.version)
            print(f"release: versions set to {args.version} and CHANGELOG section started: review, commit, then "
                  f"make release VERSION={args.version}")
        elif args.command == "build":
            _, done = build(args.version, args.image, args.out, args.tag, args.helm)
            print(f"release: {args.version} {done}")
        else:
            print(f"release: published {publish(args.version, args.registry, args.out, args.helm, args.ca_file)}")
    except rel.ReleaseError as e:
        print(f"release: {e}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as e:
        command = " ".join(str(a) for a in e.cmd[:3])
        detail = (e.stderr or "").strip().splitlines()[-1:] if isinstance(e.stderr, str) else []
        print(f"release: `{command} ...` failed (exit {e.returncode}){': ' + detail[0] if detail else ''}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
