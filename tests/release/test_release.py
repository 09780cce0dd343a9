"""`make release VERSION=x.y.z` (hack/release.py) in a throwaway checkout (tests/release/checkout.py): what a
release writes, read back the way a user reads it (helm renders the package, sha256sum checks the sums, the
wheel installs and runs), what `make release-publish` writes after the push, a second run on the tag, and what
it refuses. The image build is a fake buildah here and the registry a fake skopeo and `helm push`; `make e2e`
publishes a real release to a registry and installs it on a node (tests/e2e/node/test_registry.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_dev.chartlib import helm_path, load_all_strict

from tests.docs.doccommands import doc_commands, kubectl
from tests.release.checkout import ROOT, commit, engine_path, git, make_checkout, registry_fakes, run_release

VERSION = "0.2.0"
REPOSITORY = "ghcr.io/gpu-stack/gpu-stack-webhook"


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """(checkout, release directory, the build's process): prepare 0.2.0, commit, build."""
    where = tmp_path_factory.mktemp("release")
    repo, path = make_checkout(where), engine_path(where)
    prepared = run_release(repo, path, "prepare", VERSION)
    assert prepared.returncode == 0, prepared.stderr
    commit(repo, f"gpu-stack {VERSION}")
    built = run_release(repo, path, "build", VERSION, helm=helm_path(3))
    assert built.returncode == 0, built.stderr
    return repo, repo / "dist" / VERSION, built


def chart_file(package: Path, name: str) -> Any:
    with tarfile.open(package) as tar:
        member = tar.extractfile(f"gpu-stack/{name}")
        assert member is not None
        return yaml.safe_load(member.read())


def webhook_image(package: Path, *sets: str) -> str:
    args = [helm_path(3), "template", "gpu-stack", str(package), "--namespace", "gpu-stack"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    (deployment,) = [d for d in load_all_strict(out) if d and d["kind"] == "Deployment"
                     and d["metadata"]["name"].endswith("webhook")]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return str(container["image"])


def test_a_release_writes_its_artifacts_and_tags_the_commit(released: tuple[Path, Path, Any]) -> None:
    repo, out, built = released
    assert sorted(p.name for p in out.iterdir()) == sorted([
        "SHA256SUMS", f"gpu-stack-{VERSION}.tgz", f"gpu-stack-webhook-{VERSION}.oci.tar",
        f"gpu_stack_webhook-{VERSION}-py3-none-any.whl", f"kubectl-gpu_stack-{VERSION}.tar.gz", "gpu-stack.yaml"])
    assert built.stdout.strip() == f"release: {VERSION} in {out}, tagged v{VERSION}"
    assert git(repo, "describe", "--tags", "--exact-match").strip() == f"v{VERSION}"
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert len(check.stdout.splitlines()) == 5
    assert [p.name for p in out.parent.iterdir()] == [VERSION]  # no partial build left beside it


def test_prepare_set_every_version_the_build_checks(released: tuple[Path, Path, Any]) -> None:
    repo, _, _ = released
    assert f'version = "{VERSION}"' in (repo / "dev" / "pyproject.toml").read_text()
    readme = (repo / "README.md").read_text()
    assert f"make image IMAGE=registry.example.com/gpu-stack-webhook:{VERSION}" in readme
    assert f"--set webhook.image.tag={VERSION}" in readme
    assert "gpu-stack-webhook:0.1.0" not in readme and "webhook.image.tag=0.1.0" not in readme
    assert f"gpu-stack-webhook:{VERSION}" in (repo / "charts" / "gpu-stack" / "README.md").read_text()


def test_a_second_run_on_the_tag_finishes_and_leaves_the_files_alone(released: tuple[Path, Path, Any]) -> None:
    repo, out, _ = released
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()}
    again = run_release(repo, engine_path(repo.parent), "build", VERSION, helm=helm_path(3))
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == (f"release: {VERSION} already built in {out} and tagged v{VERSION}: nothing to do "
                                    f"(remove {out} to build again)")
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()} == before


def archive_manifest_digest(archive: Path) -> str:
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        (manifest,) = json.load(member)["manifests"]
    return str(manifest["digest"])


PUBLISHED_REPOSITORY = "registry.example:5000/gpu-stack/gpu-stack-webhook"


@pytest.fixture(scope="module")
def published(released: tuple[Path, Path, Any], tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[Path, subprocess.CompletedProcess[str], list[list[str]], Path]:
    """(release directory, the publish's process, what it asked skopeo and `helm push`, helm's registry config):
    a copy of the release published to registry.example:5000/gpu-stack with a CA file."""
    repo, out, _ = released
    where = tmp_path_factory.mktemp("publish")
    shutil.copytree(out, where / "dist" / VERSION)
    path, env, log = registry_fakes(where, helm_path(3))
    ca, config = where / "ca.crt", where / "registry.json"
    ca.write_text("a CA\n")
    config.write_text('{"auths": {}}\n')
    proc = run_release(repo, path, "publish", VERSION, "--registry", "oci://registry.example:5000/gpu-stack/",
                       "--out", str(where / "dist"), "--ca-file", str(ca), helm=str(where / "fakes" / "helm"),
                       extra_env={**env, "HELM_REGISTRY_CONFIG": str(config)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    return where / "dist" / VERSION, proc, calls, config


def test_publish_pins_the_digest_the_registry_answers_not_the_archives(
        released: tuple[Path, Path, Any], published: tuple[Path, Any, list[list[str]], Path]) -> None:
    _, out, _ = released
    pub, proc, calls, config = published
    image = f"{PUBLISHED_REPOSITORY}:{VERSION}"
    (copy, inspect, push) = calls
    assert copy[:2] == ["skopeo", "copy"] and copy[-2:] == [
        f"oci-archive:{pub / f'gpu-stack-webhook-{VERSION}.oci.tar'}", f"docker://{image}"]
    assert copy[copy.index("--dest-authfile") + 1] == str(config)  # `helm registry login`'s credentials
    assert "--dest-cert-dir" in copy and "--cert-dir" in inspect  # the CA file, as skopeo takes it
    assert inspect[:2] == ["skopeo", "inspect"] and inspect[-1] == f"docker://{image}"
    assert inspect[inspect.index("--authfile") + 1] == str(config)
    registry_digest = subprocess.run([str(pub.parent.parent / "fakes" / "skopeo"), "inspect", f"docker://{image}"],
                                     env={"FAKE_REGISTRY_LOG": os.devnull}, capture_output=True, text=True,
                                     check=True).stdout.strip()
    archive_digest = archive_manifest_digest(out / f"gpu-stack-webhook-{VERSION}.oci.tar")
    assert registry_digest != archive_digest
    assert (pub / f"gpu-stack-webhook-{VERSION}.digest").read_text() == registry_digest + "\n"
    package = pub / f"gpu-stack-{VERSION}.tgz"
    assert push[:3] == ["helm", "push", str(package)]
    assert push[3:] == ["oci://registry.example:5000/gpu-stack/charts", "--ca-file",
                        str(pub.parent.parent / "ca.crt")]
    assert chart_file(package, "values.yaml")["webhook"]["image"] == {
        "registry": "", "repository": PUBLISHED_REPOSITORY, "tag": "", "digest": registry_digest,
        "pullPolicy": "IfNotPresent"}
    assert webhook_image(package) == f"{PUBLISHED_REPOSITORY}@{registry_digest}"  # no image flags
    images = yaml.safe_load(chart_file(package, "Chart.yaml")["annotations"]["artifacthub.io/images"])
    assert images[0] == {"name": "gpu-stack-webhook", "image": f"{image}@{registry_digest}"}
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=pub, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert len(check.stdout.splitlines()) == 6
    assert proc.stdout.strip() == (
        f"release: published {image}@{registry_digest} and oci://registry.example:5000/gpu-stack/charts/gpu-stack "
        f"{VERSION} (its webhook image pinned to that digest); {pub} updated: the chart package, "
        f"gpu-stack-webhook-{VERSION}.digest and SHA256SUMS")


def test_the_chart_package_names_the_released_image(released: tuple[Path, Path, Any]) -> None:
    _, out, _ = released
    package = out / f"gpu-stack-{VERSION}.tgz"
    chart = chart_file(package, "Chart.yaml")
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION)
    assert chart_file(package, "values.yaml")["webhook"]["image"] == {
        "registry": "", "repository": REPOSITORY, "tag": "", "digest": "", "pullPolicy": "IfNotPresent"}
    assert webhook_image(package) == f"{REPOSITORY}:{VERSION}"  # no image flags
    assert webhook_image(package, "webhook.image.registry=mirror.example:5000") == (
        f"mirror.example:5000/gpu-stack/gpu-stack-webhook:{VERSION}")
    digest = "sha256:" + "0" * 64
    assert webhook_image(package, f"webhook.image.digest={digest}") == f"{REPOSITORY}@{digest}"


def test_the_chart_carries_artifacthub_annotations(released: tuple[Path, Path, Any]) -> None:
    _, out, _ = released
    annotations = chart_file(out / f"gpu-stack-{VERSION}.tgz", "Chart.yaml")["annotations"]
    images = yaml.safe_load(annotations["artifacthub.io/images"])
    assert images[0] == {"name": "gpu-stack-webhook", "image": f"{REPOSITORY}:{VERSION}"}  # the digest: publish
    assert {"name": "devicePlugin", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"} in images
    assert annotations["artifacthub.io/license"] == "Apache-2.0"
    assert annotations["artifacthub.io/prerelease"] == "false"
    changes = yaml.safe_load(annotations["artifacthub.io/changes"])
    unreleased = (ROOT / "CHANGELOG.md").read_text().split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]
    entries = [line for line in unreleased.splitlines() if line.startswith("- ")]
    assert len(changes) == len(entries) > 0
    assert all(c["kind"] in {"added", "changed", "deprecated", "removed", "fixed", "security"} for c in changes)
    assert [c["description"][:30] for c in changes] == [e[2:32] for e in entries]


def test_prepare_started_the_changelog_section(released: tuple[Path, Path, Any]) -> None:
    repo, _, _ = released
    changelog = (repo / "CHANGELOG.md").read_text()
    unreleased, rest = changelog.split("## [Unreleased]\n", 1)[1].split(f"## [{VERSION}] - ", 1)
    assert unreleased.strip() == ""
    assert rest.split("\n## [", 1)[0].count("\n- ") >= 1


def test_the_krew_manifest_points_at_the_plugin_archive(released: tuple[Path, Path, Any]) -> None:
    _, out, _ = released
    manifest = yaml.safe_load((out / "gpu-stack.yaml").read_text())
    assert (manifest["apiVersion"], manifest["kind"], manifest["metadata"]) == (
        "krew.googlecontainertools.github.com/v1alpha2", "Plugin", {"name": "gpu-stack"})
    spec = manifest["spec"]
    assert spec["version"] == f"v{VERSION}"
    assert spec["shortDescription"] and spec["homepage"].startswith("https://")
    (platform,) = spec["platforms"]
    archive = out / f"kubectl-gpu_stack-{VERSION}.tar.gz"
    assert platform["uri"].endswith(f"/v{VERSION}/{archive.name}")
    sums = dict(reversed(line.split("  ")) for line in (out / "SHA256SUMS").read_text().splitlines())
    assert platform["sha256"] == sums[archive.name]
    # krew links kubectl-<name, dashes as underscores> to `bin`, which must be in the archive, executable
    assert platform["bin"] == "kubectl-gpu_stack"
    with tarfile.open(archive) as tar:
        names = {m.name: m for m in tar.getmembers()}
    assert names["kubectl-gpu_stack"].mode & 0o111
    assert f"gpu_stack_webhook-{VERSION}-py3-none-any.whl" in names


def test_readmes_pipx_line_installs_the_kubectl_plugin_kubectl_finds(
        released: tuple[Path, Path, Any], tmp_path: Path) -> None:
    """README's `pipx install gpu_stack_webhook-<version>-py3-none-any.whl` as typed in the release's directory,
    by real pipx (the dependencies from the package index pip is configured with); then the plugin from pipx's
    bin directory, alone and as `kubectl gpu-stack` through kubectl's plugin lookup on PATH."""
    _, out, _ = released
    (line,) = [c for c in doc_commands() if c.tool == "pipx" and c.path == "README.md"]
    words = [w.replace("<version>", VERSION) for w in line.words()]
    assert words[:2] == ["pipx", "install"] and (out / words[2]).is_file(), line.where
    bin_dir = tmp_path / "bin"
    env = {**os.environ, "PIPX_HOME": str(tmp_path / "pipx"), "PIPX_BIN_DIR": str(bin_dir),
           "PIPX_MAN_DIR": str(tmp_path / "man"), "PIPX_DEFAULT_PYTHON": sys.executable}
    pipx = Path(sys.executable).with_name("pipx")  # requirements-dev.txt
    installed = subprocess.run([str(pipx), *words[1:]], cwd=out, env=env, capture_output=True, text=True,
                               check=False, timeout=600)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "kubectl-gpu_stack" in installed.stdout
    shown = subprocess.run([str(bin_dir / "kubectl-gpu_stack"), "--help"], capture_output=True, text=True,
                           check=False, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "inspect" in shown.stdout
    listed = subprocess.run([kubectl(), "plugin", "list", "--name-only"], capture_output=True, text=True,
                            check=False, env={**env, "PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert "kubectl-gpu_stack" in listed.stdout, listed.stderr
    via_kubectl = subprocess.run([kubectl(), "gpu-stack", "--help"], capture_output=True, text=True, check=False,
                                 timeout=60, env={**env, "PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert via_kubectl.returncode == 0, via_kubectl.stderr
    assert via_kubectl.stdout == shown.stdout


# ---- refusals ---------------------------------------------------------------------------------------------


@pytest.fixture
def checkout(tmp_path: Path) -> tuple[Path, str]:
    return make_checkout(tmp_path), engine_path(tmp_path)


def refused(repo: Path, path: str, *args: str) -> str:
    proc = run_release(repo, path, "build", *args, helm=shutil.which("true") or "true")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert not (repo / "dist").exists()
    assert git(repo, "tag", "--list") == ""
    return proc.stderr.strip()


def test_a_dirty_tree_is_refused(checkout: tuple[Path, str]) -> None:
    repo, path = checkout
    with (repo / "charts" / "gpu-stack" / "values.yaml").open("a") as f:
        f.write("# local change\n")
    assert refused(repo, path, "0.1.0") == (
        "release: the working tree has uncommitted changes (charts/gpu-stack/values.yaml): a release is built "
        "from a commit and tagged; commit or stash them first")


def test_an_image_tag_other_than_the_chart_version_is_refused(checkout: tuple[Path, str]) -> None:
    repo, path = checkout
    assert refused(repo, path, "0.1.0", "--image", "registry.example:5000/gpu-stack-webhook:0.0.9") == (
        "release: the image tag 0.0.9 of registry.example:5000/gpu-stack-webhook:0.0.9 does not match the chart "
        "version 0.1.0: the chart's default webhook image tag is its version; drop IMAGE or tag it "
        "registry.example:5000/gpu-stack-webhook:0.1.0")


def test_a_version_the_tree_does_not_carry_is_refused(checkout: tuple[Path, str]) -> None:
    repo, path = checkout
    message = refused(repo, path, "0.3.0")
    assert message.startswith(
        "release: the chart version does not match 0.3.0: charts/gpu-stack/Chart.yaml version is 0.1.0; "
        "charts/gpu-stack/Chart.yaml appVersion is 0.1.0; webhook/pyproject.toml version is 0.1.0; "
        "gpu_stack_webhook.__version__ is 0.1.0; dev/pyproject.toml version is 0.1.0; README.md:"), message
    assert message.endswith(". Run `make release-prepare VERSION=0.3.0`, review and commit (CONTRIBUTING.md, "
                            "\"Releasing\")"), message


def test_a_readme_example_left_at_another_version_is_refused(checkout: tuple[Path, str]) -> None:
    repo, path = checkout
    readme = repo / "README.md"
    text = readme.read_text()
    line = text[:text.index("webhook.image.tag=0.1.0")].count("\n") + 1
    readme.write_text(text.replace("webhook.image.tag=0.1.0", "webhook.image.tag=0.0.9"))
    commit(repo, "a stale example")
    assert refused(repo, path, "0.1.0") == (
        f"release: the chart version does not match 0.1.0: README.md:{line} `webhook.image.tag=` is 0.0.9. Run "
        "`make release-prepare VERSION=0.1.0`, review and commit (CONTRIBUTING.md, \"Releasing\")")


def test_a_version_without_a_changelog_section_is_refused(checkout: tuple[Path, str]) -> None:
    repo, path = checkout
    changelog = repo / "CHANGELOG.md"
    changelog.write_text(changelog.read_text().replace("## [0.1.0]", "## [0.0.1]"))
    commit(repo, "no 0.1.0 section")
    assert refused(repo, path, "0.1.0") == (
        "release: CHANGELOG.md has no section `## [0.1.0]` with its changes: run `make release-prepare "
        "VERSION=0.1.0` (it turns [Unreleased] into it)")


NOT_SEMVER = ["v1.2", "1.2", "1.2.3.4", "01.2.3", "1.02.3", "1.2.3-", "1.2.3-rc..1", "1.2.3-01", "1.2.3+build",
              "1.2.3 "]


@pytest.mark.parametrize("version", NOT_SEMVER)
def test_not_a_version_is_refused_before_anything_is_built(checkout: tuple[Path, str], version: str) -> None:
    repo, path = checkout
    assert refused(repo, path, version) == (
        f"release: VERSION={version!r} is not a semantic version x.y.z (or x.y.z-pre)")


@pytest.mark.parametrize("version", ["v1.2", "1.2.3-01"])
def test_prepare_refuses_not_a_version_and_changes_nothing(checkout: tuple[Path, str], version: str) -> None:
    repo, path = checkout
    proc = run_release(repo, path, "prepare", version)
    assert (proc.returncode, proc.stderr.strip()) == (
        1, f"release: VERSION={version!r} is not a semantic version x.y.z (or x.y.z-pre)")
    assert git(repo, "status", "--porcelain") == ""


def test_semver_prereleases_are_versions(checkout: tuple[Path, str]) -> None:
    repo, path = checkout
    for version in ("1.2.3-rc.1", "0.0.0-alpha-2.0", "10.20.30-x.7z.92"):
        message = refused(repo, path, version)  # refused for the tree's versions, after the version passed
        assert message.startswith(f"release: the chart version does not match {version}:"), message


def test_a_second_run_on_the_tag_stops_before_it_touches_files_it_did_not_write(
        checkout: tuple[Path, str]) -> None:
    """Tagged on this commit, dist/0.1.0 holding something other than the files its SHA256SUMS lists: stopped
    with nothing deleted; with dist/0.1.0 gone, built again and the tag kept."""
    repo, path = checkout
    first = run_release(repo, path, "build", "0.1.0", helm=helm_path(3))
    assert first.returncode == 0, first.stderr
    tag = git(repo, "rev-parse", "v0.1.0")
    out = repo / "dist" / "0.1.0"
    (out / "notes.txt").write_text("mine\n")
    second = run_release(repo, path, "build", "0.1.0", helm=helm_path(3))
    assert (second.returncode, second.stderr.strip()) == (1, (
        f"release: v0.1.0 tags this commit and {out} is not the release's files (notes.txt is not in SHA256SUMS): "
        f"nothing was changed. Remove {out} to build the release again"))
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "SHA256SUMS").is_file()
    shutil.rmtree(out)
    third = run_release(repo, path, "build", "0.1.0", helm=helm_path(3))
    assert third.returncode == 0, third.stderr
    assert third.stdout.strip() == f"release: 0.1.0 in {out}, v0.1.0 already tagged this commit"
    assert git(repo, "rev-parse", "v0.1.0") == tag
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


def test_publish_refuses_a_release_that_was_not_built(checkout: tuple[Path, str]) -> None:
    repo, path = checkout
    proc = run_release(repo, path, "publish", "0.1.0", "--registry", "registry.example:5000/gpu-stack")
    assert (proc.returncode, proc.stderr.strip()) == (
        1, f"release: {repo / 'dist' / '0.1.0'} does not exist: `make release VERSION=0.1.0` builds it first")


def test_make_release_passes_version_image_and_tag_choice() -> None:
    make = shutil.which("make") or "make"
    shown = subprocess.run([make, "-n", "--no-print-directory", "-C", str(ROOT), "release", "VERSION=1.2.3",
                            "IMAGE=r.example/w:1.2.3", "RELEASE_TAG=0", "RELEASE_DIR=out"], capture_output=True,
                           text=True, check=True).stdout
    assert 'hack/release.py build "1.2.3" --out "out" --image "r.example/w:1.2.3" --no-tag' in " ".join(
        shown.replace("\\\n", " ").split())
    missing = subprocess.run([make, "--no-print-directory", "-C", str(ROOT), "release"], capture_output=True,
                             text=True, check=False)
    assert missing.returncode != 0
    assert "release: VERSION=x.y.z is required" in missing.stderr


def test_make_release_publish_passes_version_registry_and_ca() -> None:
    make = shutil.which("make") or "make"
    shown = subprocess.run([make, "-n", "--no-print-directory", "-C", str(ROOT), "release-publish", "VERSION=1.2.3",
                            "REGISTRY=r.example/team", "REGISTRY_CA=ca.crt", "RELEASE_DIR=out"],
                           capture_output=True, text=True, check=True).stdout
    assert 'hack/release.py publish "1.2.3" --registry "r.example/team" --out "out" --ca-file "ca.crt"' in " ".join(
        shown.replace("\\\n", " ").split())
    missing = subprocess.run([make, "--no-print-directory", "-C", str(ROOT), "release-publish", "VERSION=1.2.3"],
                             capture_output=True, text=True, check=False)
    assert missing.returncode != 0
    assert "release: VERSION=x.y.z and REGISTRY=host[/path] are required" in missing.stderr
