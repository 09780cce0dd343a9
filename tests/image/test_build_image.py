"""`make image` (hack/build-image.sh): webhook/Dockerfile built by the first of docker, podman, buildah on PATH
that can build.

PATH holds fake engines that record every call (arguments and the directory they were started in); a fake
made `broken` fails `info` as a docker client without a daemon does. What a user would see is the command
line the engine gets, the script's own output and its exit status. The build context itself is checked
against the Dockerfile and webhook/.dockerignore. `make e2e` builds the real image with buildah and runs it
on a node (tests/e2e/node/test_image.py).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "build-image.sh"
BASH = shutil.which("bash") or "/bin/bash"
APP_VERSION = str(yaml.safe_load((ROOT / "charts" / "gpu-stack" / "Chart.yaml").read_text())["appVersion"])
DEFAULT_IMAGE = f"gpu-stack-webhook:{APP_VERSION}"
NO_ENGINE = ("build-image: no container engine on PATH: install docker, podman or buildah to build "
             f"{DEFAULT_IMAGE}\n")


DAEMONLESS = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"


def fake_path(tmp_path: Path, engines: tuple[str, ...], exit_code: int = 0, broken: tuple[str, ...] = ()) -> str:
    """A PATH with fake `engines` (each appends its cwd and argv to <tmp>/<engine>.calls, one call a line, and
    keeps the last build or save call in <tmp>/<engine>.argv) and bash and find (make runs the script through
    `/usr/bin/env bash`, and the Makefile's file list uses find): no real engine. `broken` engines fail `info`."""
    fakes, tools = tmp_path / "fakes", tmp_path / "tools"
    fakes.mkdir()
    tools.mkdir()
    for engine in engines:
        script = fakes / engine
        info = (f'echo "{DAEMONLESS}" >&2; echo "second line" >&2; exit 1' if engine in broken else "exit 0")
        script.write_text(f'#!{BASH}\necho "$PWD $*" >> "{tmp_path}/{engine}.calls"\n'
                          f'[[ "$1" == info ]] && {{ {info}; }}\n'
                          f'printf "%s\\n" "$PWD" "$@" > "{tmp_path}/{engine}.argv"\nexit {exit_code}\n')
        script.chmod(0o755)
    for tool in ("bash", "find"):
        found = shutil.which(tool)
        assert found, tool
        (tools / tool).symlink_to(found)
    return f"{fakes}:{tools}"


def run_script(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BASH, str(SCRIPT), *args], env={"PATH": path}, capture_output=True, text=True,
                          timeout=60, check=False)


def recorded(tmp_path: Path) -> dict[str, tuple[str, list[str]]]:
    """engine -> (the directory it ran in, its arguments), for each fake engine that was called."""
    out = {}
    for record in sorted(tmp_path.glob("*.argv")):
        cwd, *argv = record.read_text().splitlines()
        out[record.name.removesuffix(".argv")] = (cwd, argv)
    return out


@pytest.mark.parametrize(("installed", "chosen", "argv"), [
    (("docker", "podman", "buildah"), "docker", ["build", "-f", "webhook/Dockerfile", "-t", DEFAULT_IMAGE, "webhook"]),
    (("podman", "buildah"), "podman", ["build", "-f", "webhook/Dockerfile", "-t", DEFAULT_IMAGE, "webhook"]),
    (("buildah",), "buildah", ["bud", "-f", "webhook/Dockerfile", "-t", DEFAULT_IMAGE, "webhook"]),
])
def test_first_engine_on_path_builds_the_default_image(tmp_path: Path, installed: tuple[str, ...], chosen: str,
                                                       argv: list[str]) -> None:
    proc = run_script(fake_path(tmp_path, installed))
    assert proc.returncode == 0, proc.stderr
    assert recorded(tmp_path) == {chosen: (str(ROOT), argv)}
    assert proc.stderr == f"+ {chosen} {' '.join(argv)}\n"


def test_image_argument_names_the_image(tmp_path: Path) -> None:
    proc = run_script(fake_path(tmp_path, ("podman",)), "registry.example:5000/team/gpu-stack-webhook:1.2.3")
    assert proc.returncode == 0, proc.stderr
    assert recorded(tmp_path) == {"podman": (str(ROOT), [
        "build", "-f", "webhook/Dockerfile", "-t", "registry.example:5000/team/gpu-stack-webhook:1.2.3", "webhook"])}


def test_no_engine_is_a_clear_error(tmp_path: Path) -> None:
    proc = run_script(fake_path(tmp_path, ()))
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", NO_ENGINE)


def test_an_engine_that_cannot_build_is_reported_and_the_next_one_builds(tmp_path: Path) -> None:
    proc = run_script(fake_path(tmp_path, ("docker", "buildah"), broken=("docker",)))
    assert proc.returncode == 0, proc.stderr
    assert recorded(tmp_path) == {"buildah": (str(ROOT), ["bud", "-f", "webhook/Dockerfile", "-t", DEFAULT_IMAGE,
                                                          "webhook"])}
    assert proc.stderr.splitlines() == [
        f"build-image: docker is on PATH but cannot build ({DAEMONLESS}); trying the next engine",
        f"+ buildah bud -f webhook/Dockerfile -t {DEFAULT_IMAGE} webhook"]


def test_when_no_engine_on_path_can_build_the_error_names_them(tmp_path: Path) -> None:
    proc = run_script(fake_path(tmp_path, ("docker", "podman"), broken=("docker", "podman")))
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == (
        f"build-image: no engine on PATH can build {DEFAULT_IMAGE} (tried docker podman)")
    assert recorded(tmp_path) == {}


def test_base_ca_bundle_and_archive_reach_buildah(tmp_path: Path) -> None:
    bundle = tmp_path / "ca.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    proc = subprocess.run([BASH, str(SCRIPT), "localhost/gpu-stack-webhook:e2e"], capture_output=True, text=True,
                          timeout=60, check=False,
                          env={"PATH": fake_path(tmp_path, ("buildah",)),
                               "PYTHON_IMAGE": "localhost/python-standin:3.11", "CA_BUNDLE": str(bundle),
                               "IMAGE_ARCHIVE": str(tmp_path / "image.tar")})
    assert proc.returncode == 0, proc.stderr
    calls = (tmp_path / "buildah.calls").read_text().splitlines()
    assert calls == [
        f"{ROOT} info",
        f"{ROOT} bud --build-arg PYTHON_IMAGE=localhost/python-standin:3.11 --secret id=ca_bundle,src={bundle} "
        "-f webhook/Dockerfile -t localhost/gpu-stack-webhook:e2e webhook",
        f"{ROOT} push --quiet localhost/gpu-stack-webhook:e2e "
        f"docker-archive:{tmp_path}/image.tar:localhost/gpu-stack-webhook:e2e"]


@pytest.mark.parametrize(("engine", "build"), [("docker", "build"), ("podman", "build"), ("buildah", "bud")])
def test_every_engine_takes_the_ca_bundle_as_a_build_secret(tmp_path: Path, engine: str, build: str) -> None:
    bundle = tmp_path / "ca.crt"
    bundle.write_text("x")
    proc = subprocess.run([BASH, str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": fake_path(tmp_path, (engine,)), "CA_BUNDLE": str(bundle)})
    assert proc.returncode == 0, proc.stderr
    assert recorded(tmp_path) == {engine: (str(ROOT), [
        build, "--secret", f"id=ca_bundle,src={bundle}", "-f", "webhook/Dockerfile", "-t", DEFAULT_IMAGE, "webhook"])}


def test_the_dockerfile_mounts_the_secret_where_downloads_look() -> None:
    """Every RUN step that downloads (pip install from the index, apt-get) mounts the `ca_bundle` secret over
    the system bundle; the steps that do not, do not."""
    steps = " ".join((ROOT / "webhook" / "Dockerfile").read_text().replace("\\\n", " ").split("\n")).split(" RUN ")
    mount = "--mount=type=secret,id=ca_bundle,target=/etc/ssl/certs/ca-certificates.crt"
    downloading = [s for s in steps if "pip install --no-deps -r" in s or "apt-get update" in s]
    assert len(downloading) == 2
    assert all(s.split()[0] == mount for s in downloading)


@pytest.mark.parametrize("engine", ["podman", "buildah"])
def test_an_oci_archive_is_written_by_push(tmp_path: Path, engine: str) -> None:
    proc = subprocess.run([BASH, str(SCRIPT), "r.example/w:1.0.0"], capture_output=True, text=True, timeout=60,
                          check=False, env={"PATH": fake_path(tmp_path, (engine,)),
                                            "IMAGE_ARCHIVE": str(tmp_path / "w.tar"),
                                            "IMAGE_ARCHIVE_FORMAT": "oci-archive"})
    assert proc.returncode == 0, proc.stderr
    assert recorded(tmp_path)[engine][1] == ["push", "--quiet", "r.example/w:1.0.0",
                                             f"oci-archive:{tmp_path}/w.tar:r.example/w:1.0.0"]


def test_an_unknown_archive_format_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run([BASH, str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": fake_path(tmp_path, ("buildah",)), "IMAGE_ARCHIVE_FORMAT": "tar"})
    assert (proc.returncode, proc.stderr.strip()) == (
        1, "build-image: IMAGE_ARCHIVE_FORMAT=tar: docker-archive or oci-archive")
    assert recorded(tmp_path) == {}


def test_a_failing_build_fails(tmp_path: Path) -> None:
    proc = run_script(fake_path(tmp_path, ("docker",), exit_code=7))
    assert proc.returncode == 7
    assert "docker" in recorded(tmp_path)


def make_image(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    make = shutil.which("make")
    assert make, "make is not installed"
    return subprocess.run([make, "--no-print-directory", "-C", str(ROOT), "image", *args], env={"PATH": path},
                          capture_output=True, text=True, timeout=60, check=False)


def test_make_image_passes_image(tmp_path: Path) -> None:
    proc = make_image(fake_path(tmp_path, ("buildah",)), "IMAGE=registry.example/gpu-stack-webhook:dev")
    assert proc.returncode == 0, proc.stderr
    assert recorded(tmp_path) == {"buildah": (str(ROOT), [
        "bud", "-f", "webhook/Dockerfile", "-t", "registry.example/gpu-stack-webhook:dev", "webhook"])}


def test_make_image_defaults_to_the_app_version(tmp_path: Path) -> None:
    proc = make_image(fake_path(tmp_path, ("docker", "podman")))
    assert proc.returncode == 0, proc.stderr
    assert recorded(tmp_path) == {"docker": (str(ROOT), [
        "build", "-f", "webhook/Dockerfile", "-t", DEFAULT_IMAGE, "webhook"])}


def test_make_image_without_an_engine_fails_with_the_message(tmp_path: Path) -> None:
    proc = make_image(fake_path(tmp_path, ()))
    assert proc.returncode != 0
    assert NO_ENGINE in proc.stderr


def test_the_context_holds_what_the_dockerfile_copies() -> None:
    """webhook/ is the context: every COPY source is there and let in by webhook/.dockerignore."""
    context = ROOT / "webhook"
    allowed = {line[1:].rstrip("/") for line in (context / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}
    sources = []
    for line in (context / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words and words[0] == "COPY" and not any(w.startswith("--from") for w in words):
            sources += [w.rstrip("/") for w in words[1:-1]]
    assert sources, "no COPY in webhook/Dockerfile"
    assert [s for s in sources if not (context / s).exists()] == []
    assert [s for s in sources if s not in allowed] == []
