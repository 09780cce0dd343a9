"""`make image` (hack/build-image.sh): webhook/Dockerfile built by the first of docker, podman, buildah on PATH.

No engine can run here, so PATH holds fake ones that record the arguments and the directory they were
started in; what a user would see is the command line the engine gets, the script's own output and its
exit status. The build context itself is checked against the Dockerfile and webhook/.dockerignore.
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


def fake_path(tmp_path: Path, engines: tuple[str, ...], exit_code: int = 0) -> str:
    """A PATH with fake `engines` (each records cwd and argv in <tmp>/<engine>.argv) and bash and find
    (make runs the script through `/usr/bin/env bash`, and the Makefile's file list uses find): no real engine."""
    fakes, tools = tmp_path / "fakes", tmp_path / "tools"
    fakes.mkdir()
    tools.mkdir()
    for engine in engines:
        script = fakes / engine
        script.write_text(f'#!{BASH}\nprintf "%s\\n" "$PWD" "$@" > "{tmp_path}/{engine}.argv"\nexit {exit_code}\n')
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
