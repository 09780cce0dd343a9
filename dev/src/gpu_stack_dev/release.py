"""What `make release VERSION=x.y.z` checks and writes, apart from running the tools (hack/release.py runs
git, the image build, helm and pip): the version rules, the CHANGELOG section, the packaged chart's
Chart.yaml and values, the OCI archive's digest, the krew manifest and the checksum file."""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

# SemVer 2.0.0 (https://semver.org/#backusnaur-form-grammar-for-valid-semver-versions) without build metadata:
# x.y.z or x.y.z-pre, no leading zeros, pre-release identifiers dot-separated, non-empty, numeric ones without
# leading zeros.
_NUMBER = r"(?:0|[1-9]\d*)"
_PRE_ID = r"(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)"
VERSION = re.compile(rf"^{_NUMBER}\.{_NUMBER}\.{_NUMBER}(?:-{_PRE_ID}(?:\.{_PRE_ID})*)?$")
SEMVER = r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]*[0-9A-Za-z])?"
# The documents' examples that name the chart's version (the webhook image `make image` tags with it):
# `gpu-stack-webhook:x.y.z` and `webhook.image.tag=x.y.z`.
EXAMPLE_DOCUMENTS = ("README.md", "charts/gpu-stack/README.md", "docs/real-node.md")
EXAMPLE_VERSION = re.compile(rf"((?:\bgpu-stack-webhook:|\bwebhook\.image\.tag=))({SEMVER})\b")
# Keep a Changelog's section headings -> artifacthub.io/changes kinds (https://artifacthub.io/docs/topics/annotations/helm/).
CHANGE_KINDS = {"Added": "added", "Changed": "changed", "Deprecated": "deprecated", "Removed": "removed",
                "Fixed": "fixed", "Security": "security"}
WEBHOOK_IMAGE_NAME = "gpu-stack-webhook"
KREW_PLUGIN = "gpu-stack"
PLUGIN_BINARY = "kubectl-gpu_stack"


class ReleaseError(Exception):
    """A release refused: the message says why and what to do."""


def check_version(version: str) -> None:
    if not VERSION.match(version):
        raise ReleaseError(f"VERSION={version!r} is not a semantic version x.y.z (or x.y.z-pre)")


def is_prerelease(version: str) -> bool:
    return "-" in version


def split_image(image: str) -> tuple[str, str]:
    """'registry/name:tag' -> ('registry/name', 'tag'); the tag is '' when there is none (a port is not one)."""
    name, _, last = image.rpartition("/")
    if ":" not in last:
        return image, ""
    repo_last, _, tag = last.partition(":")
    return (f"{name}/{repo_last}" if name else repo_last), tag


def check_image_tag(image: str, version: str) -> str:
    """The repository of `image`, whose tag must be the chart's version (the chart's default image tag is its
    appVersion, so another tag would be an image the chart never pulls)."""
    repository, tag = split_image(image)
    if tag != version:
        raise ReleaseError(f"the image tag {tag or '(none)'} of {image} does not match the chart version "
                           f"{version}: the chart's default webhook image tag is its version; drop IMAGE or "
                           f"tag it {repository}:{version}")
    return repository


PACKAGE_VERSION = re.compile(r'^(__version__\s*=\s*)"([^"]*)"', re.M)
PROJECT_VERSION = re.compile(r'^(\[project\][^\[]*?^version\s*=\s*)"([^"]*)"', re.M | re.S)


def example_versions(path: str, text: str) -> dict[str, str]:
    """`path:line example` -> the version each of the document's examples names (EXAMPLE_VERSION)."""
    return {f"{path}:{text.count(chr(10), 0, m.start()) + 1} `{m.group(1)}`": m.group(2)
            for m in EXAMPLE_VERSION.finditer(text)}


def set_example_versions(text: str, version: str) -> str:
    return EXAMPLE_VERSION.sub(lambda m: m.group(1) + version, text)


def tree_versions(chart_yaml: str, webhook_pyproject: str, webhook_init: str, dev_pyproject: str = "",
                  documents: Mapping[str, str] | None = None) -> dict[str, str]:
    """Where the version lives in the checkout -> the version written there (`documents`: path -> text of
    EXAMPLE_DOCUMENTS, whose examples name it)."""
    chart = yaml.safe_load(chart_yaml)
    project, package = PROJECT_VERSION.search(webhook_pyproject), PACKAGE_VERSION.search(webhook_init)
    dev = PROJECT_VERSION.search(dev_pyproject)
    versions = {"charts/gpu-stack/Chart.yaml version": str(chart["version"]),
                "charts/gpu-stack/Chart.yaml appVersion": str(chart["appVersion"]),
                "webhook/pyproject.toml version": project.group(2) if project else "",
                "gpu_stack_webhook.__version__": package.group(2) if package else "",
                "dev/pyproject.toml version": dev.group(2) if dev else ""}
    for path, text in (documents or {}).items():
        versions.update(example_versions(path, text))
    return versions


def check_tree_versions(versions: Mapping[str, str], version: str) -> None:
    wrong = [f"{where} is {found or '(none)'}" for where, found in versions.items() if found != version]
    if wrong:
        raise ReleaseError(f"the chart version does not match {version}: {'; '.join(wrong)}. Run "
                           f"`make release-prepare VERSION={version}`, review and commit (CONTRIBUTING.md, "
                           "\"Releasing\")")


def set_versions(chart_yaml: str, webhook_pyproject: str, webhook_init: str, version: str) -> tuple[str, str, str]:
    """Chart.yaml's version and appVersion and the webhook package's version set to `version`."""
    chart = re.sub(r"^version:.*$", f"version: {version}", chart_yaml, count=1, flags=re.M)
    chart = re.sub(r"^appVersion:.*$", f'appVersion: "{version}"', chart, count=1, flags=re.M)
    return chart, set_project_version(webhook_pyproject, version), PACKAGE_VERSION.sub(
        rf'\g<1>"{version}"', webhook_init, count=1)


def set_project_version(pyproject: str, version: str) -> str:
    """A pyproject.toml's [project] version set to `version`."""
    return PROJECT_VERSION.sub(rf'\g<1>"{version}"', pyproject, count=1)


def changelog_section(changelog: str, version: str) -> str:
    """The body of `## [version]` (up to the next `## [`); ReleaseError when there is none or it is empty."""
    match = re.search(rf"^## \[{re.escape(version)}\][^\n]*\n(.*?)(?=^## \[|\Z)", changelog, re.M | re.S)
    if not match or not match.group(1).strip():
        raise ReleaseError(f"CHANGELOG.md has no section `## [{version}]` with its changes: run "
                           f"`make release-prepare VERSION={version}` (it turns [Unreleased] into it)")
    return match.group(1).strip()


def start_changelog_section(changelog: str, version: str, date: str) -> str:
    """[Unreleased]'s entries become the section `## [version] - date` under an empty [Unreleased]."""
    if re.search(rf"^## \[{re.escape(version)}\]", changelog, re.M):
        raise ReleaseError(f"CHANGELOG.md already has a section [{version}]")
    head, found, rest = changelog.partition("## [Unreleased]\n")
    body = re.split(r"^(?=## \[)", rest, maxsplit=1, flags=re.M)[0] if found else ""
    if not body.strip():
        raise ReleaseError("CHANGELOG.md's [Unreleased] section lists no change to release")
    return f"{head}## [Unreleased]\n\n## [{version}] - {date}\n{rest}"


def artifacthub_changes(section: str) -> list[dict[str, str]]:
    """The `- ...` entries under each `### Added` (etc.) heading, one line each, as artifacthub.io/changes."""
    changes: list[dict[str, str]] = []
    kind = ""
    for line in section.splitlines():
        heading = re.match(r"^### (\w+)", line)
        if heading:
            kind = CHANGE_KINDS.get(heading.group(1), "")
        elif kind and line.startswith("- "):
            changes.append({"kind": kind, "description": line[2:].strip()})
        elif kind and changes and line.startswith("  ") and line.strip():
            changes[-1]["description"] += " " + line.strip()
    return changes


def chart_images(values: Any, path: str = "") -> list[tuple[str, str]]:
    """(values path, repository:tag) of every `image` with a repository and a tag in the chart's values."""
    found: list[tuple[str, str]] = []
    if isinstance(values, dict):
        image = values.get("image")
        if isinstance(image, dict) and image.get("repository") and image.get("tag"):
            found.append((path, f"{image['repository']}:{image['tag']}"))
        for key, value in values.items():
            found += chart_images(value, f"{path}.{key}" if path else key)
    return found


def artifacthub_annotations(values: Any, webhook_image: str, version: str, changes: list[dict[str, str]],
                            license_id: str) -> dict[str, str]:
    """Chart.yaml annotations for Artifact Hub: images (the webhook's pinned by digest), license, changes,
    prerelease."""
    images = [{"name": WEBHOOK_IMAGE_NAME, "image": webhook_image}]
    images += [{"name": path.rsplit(".", 1)[-1] if "." in path else path, "image": image}
               for path, image in chart_images(values) if not path.startswith("webhook")]
    unique = list({i["image"]: i for i in images}.values())
    return {"artifacthub.io/images": yaml.safe_dump(unique, sort_keys=False),
            "artifacthub.io/license": license_id,
            "artifacthub.io/changes": yaml.safe_dump(changes, sort_keys=False, width=1000),
            "artifacthub.io/prerelease": "true" if is_prerelease(version) else "false"}


def released_chart_yaml(chart_yaml: str, annotations: Mapping[str, str]) -> str:
    """Chart.yaml with `annotations` in place of any it had."""
    chart = yaml.safe_load(chart_yaml)
    chart["annotations"] = {**chart.get("annotations", {}), **annotations}
    return yaml.safe_dump(chart, sort_keys=False, width=1000)


def released_values(values_yaml: str, repository: str, digest: str = "") -> str:
    """values.yaml with webhook.image.repository set to where the release's image is published and, once the
    registry has told it (`make release-publish`), webhook.image.digest to the digest it serves (the text is
    kept, comments and all: `helm show values` shows them)."""
    released = values_yaml
    for key, value in (("repository", repository), ("digest", digest)):
        if not value:
            continue
        pattern = re.compile(rf'(^webhook:\n(?:(?:  .*|\s*)\n)*?  image:\n(?:(?:    .*|\s*)\n)*?    {key}: ).*$',
                             re.M)
        quoted = json.dumps(value).replace("\\", "\\\\")  # a replacement template: its backslashes escaped
        released, count = pattern.subn(rf"\g<1>{quoted}", released, count=1)
        if count != 1:
            raise ReleaseError(f"the chart's values.yaml has no webhook.image.{key} to set")
    return released


def webhook_image_ref(repository: str, version: str, digest: str = "") -> str:
    """The released webhook image as the artifacthub.io/images annotation names it."""
    return f"{repository}:{version}" + (f"@{digest}" if digest else "")


def archive_transport(archive: Path) -> str:
    """skopeo's transport for an image tarball: an OCI layout has index.json, a docker-archive manifest.json
    (`docker save` >= 25 writes both: it is read as the docker-archive it is)."""
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    docker = "manifest.json" in names or "./manifest.json" in names
    return "docker-archive" if docker else "oci-archive"


DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def check_digest(digest: str, image: str) -> str:
    if not DIGEST.match(digest):
        raise ReleaseError(f"the registry answered {digest!r} for the digest of {image}, not sha256:<64 hex>")
    return digest


def read_sha256sums(directory: Path) -> list[str]:
    """What is wrong with `directory` as a release's files: SHA256SUMS missing, a file it lists missing or
    changed, a file it does not list ([] when `sha256sum -c SHA256SUMS` would pass and lists every file)."""
    sums = directory / "SHA256SUMS"
    if not sums.is_file():
        return ["no SHA256SUMS"]
    listed: dict[str, str] = {}
    for line in sums.read_text().splitlines():
        digest, _, name = line.partition("  ")
        listed[name] = digest
    problems = [f"{name} is missing" for name in listed if not (directory / name).is_file()]
    problems += [f"{name} does not match SHA256SUMS" for name, digest in listed.items()
                 if (directory / name).is_file() and sha256_file(directory / name) != digest]
    problems += [f"{p.name} is not in SHA256SUMS" for p in sorted(directory.iterdir())
                 if p.name != "SHA256SUMS" and p.name not in listed]
    return problems


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256sums(files: Iterable[Path]) -> str:
    """`sha256sum -c` input for `files` (names relative to their directory)."""
    return "".join(f"{sha256_file(f)}  {f.name}\n" for f in sorted(files))


def krew_manifest(version: str, uri: str, sha256: str, homepage: str) -> dict[str, Any]:
    """The krew plugin manifest (krew.googlecontainertools.github.com/v1alpha2 Plugin) of the plugin archive:
    one platform entry for Linux and macOS, the launcher needs python3 and pipx (it installs the wheel)."""
    return {
        "apiVersion": "krew.googlecontainertools.github.com/v1alpha2",
        "kind": "Plugin",
        "metadata": {"name": KREW_PLUGIN},
        "spec": {
            "version": f"v{version}",
            "homepage": homepage,
            "shortDescription": "Inspect a gpu-stack cluster's GPU nodes and who holds which GPU",
            "description": ("`kubectl gpu-stack inspect` shows the GPU nodes, their sharing (time-slicing, MPS, "
                            "MIG), the pods holding each GPU and the installed dashboards of a cluster running "
                            "the gpu-stack chart. Needs python3 >= 3.11 and pipx: the plugin installs the "
                            "gpu_stack_webhook wheel it ships on first use."),
            "platforms": [{
                "selector": {"matchExpressions": [{"key": "os", "operator": "In", "values": ["linux", "darwin"]}]},
                "uri": uri,
                "sha256": sha256,
                "bin": PLUGIN_BINARY,
            }],
        },
    }
