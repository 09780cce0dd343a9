"""The MPS control daemon's livenessProbe, run as the kubelet runs it against the directory layout the real
daemon writes (k8s-device-plugin v0.20.0 cmd/mps-control-daemon/mps/root.go: <root>/<resource name>/.started and
<root>/<resource name>/pipe, the resource name being <domain>/<name>, so /mps/nvidia.com/gpu/.started), with an
nvidia-cuda-mps-control that answers or not. The node test (tests/e2e/node/test_agents_mps.py) runs it on the
real daemon."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from gpu_stack_dev.chartlib import FULLNAME, render


def liveness_command() -> str:
    objects = render(3, "mps-x10.yaml").objects()
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"
                    and o["metadata"]["name"] == f"{FULLNAME}-mps-control-daemon"]
    (container,) = [c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "mps-control-daemon"]
    command: list[str] = container["livenessProbe"]["exec"]["command"]
    assert command[:2] == ["sh", "-c"]
    return command[2]


def run_probe(tmp_path: Path, resources: list[str], answers: bool) -> int:
    root = tmp_path / "mps"
    for resource in resources:
        (root / resource / "pipe").mkdir(parents=True)
        (root / resource / ".started").touch()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / "nvidia-cuda-mps-control"
    # answers only for a pipe directory of a started daemon, as the real control client does
    control.write_text(f'#!/bin/sh\ncat >/dev/null\n[ -d "$CUDA_MPS_PIPE_DIRECTORY" ] && exit {0 if answers else 1}\n'
                       "exit 1\n")
    control.chmod(0o755)
    script = liveness_command().replace("/mps/", f"{root}/")
    return subprocess.run(["sh", "-c", script], env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, check=False).returncode


@pytest.mark.parametrize("resources", [["nvidia.com/gpu"], ["nvidia.com/gpu", "nvidia.com/gpu.shared"]])
def test_the_probe_fails_when_a_started_daemon_stops_answering(tmp_path: Path, resources: list[str]) -> None:
    assert run_probe(tmp_path, resources, answers=False) != 0


def test_the_probe_passes_while_every_started_daemon_answers(tmp_path: Path) -> None:
    assert run_probe(tmp_path, ["nvidia.com/gpu"], answers=True) == 0
