"""`gpu-stack-webhook check --engine cel`: the chart's CEL admission policies, evaluated offline."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from gpu_stack_webhook.cli.main import main

DEMO = Path(__file__).resolve().parents[2] / "hack" / "demo" / "manifests"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    status = main(["check", "--engine", "cel", *argv])
    return status, capsys.readouterr().out


def test_bad_manifests_are_denied_as_the_api_server_prints_a_policy_denial(capsys: pytest.CaptureFixture[str]) -> None:
    status, out = run(capsys, "-f", str(DEMO / "10-bad-nvidia-visible-devices.yaml"))
    assert status == 1
    assert out.splitlines()[1] == (
        'Error from server (Forbidden): error when creating "' + str(DEMO / "10-bad-nvidia-visible-devices.yaml")
        + "\": pods \"sneaky\" is forbidden: ValidatingAdmissionPolicy 'gpu-stack-gpu002' with binding "
        "'gpu-stack-gpu002' denied request: GPU002 container \"main\" sets NVIDIA_VISIBLE_DEVICES explicitly; GPUs "
        "are assigned by the device plugin, request nvidia.com/gpu instead (spec.containers[0].env[0])")


@pytest.mark.parametrize(("manifest", "outcome", "rule"), [
    ("01-nvidia-cuda-vectoradd.yaml", "allowed", ""),
    ("11-bad-privileged-gpu.yaml", "denied", "gpu-stack-gpu003"),
    ("12-bad-deployment-template.yaml", "denied", "gpu-stack-gpu002"),
    ("14-gpu-request-limit-mismatch.yaml", "denied", "gpu-stack-gpu001"),
    ("13-gpu-request-only.yaml", "patched", ""),
    ("16-bypass-cdi-and-device-mount.yaml", "denied", "gpu-stack-gpu007"),
    ("17-bad-sys-admin-sidecar.yaml", "denied", "gpu-stack-gpu003"),
])
def test_demo_manifests(capsys: pytest.CaptureFixture[str], manifest: str, outcome: str, rule: str) -> None:
    status, out = run(capsys, "-f", str(DEMO / manifest))
    assert out.splitlines()[0].endswith(f": {outcome}"), out
    assert status == (1 if outcome == "denied" else 0)
    assert f"ValidatingAdmissionPolicy '{rule}'" in out if rule else "ValidatingAdmissionPolicy" not in out


def test_the_limit_fill_patch_and_the_policy_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = run(capsys, "-f", str(DEMO / "13-gpu-request-only.yaml"))
    assert status == 0 and '"path":"/spec/containers/0/resources/limits/nvidia.com~1gpu","value":1' in out
    config = tmp_path / "policy.yaml"
    config.write_text(yaml.safe_dump({"injectRuntimeClassName": "nvidia"}))
    status, out = run(capsys, "--config", str(config), "-f", str(DEMO / "13-gpu-request-only.yaml"))
    assert '"path":"/spec/runtimeClassName","value":"nvidia"' in out


def test_exempt_namespaces_and_other_kinds_are_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = run(capsys, "-n", "kube-system", "-f", str(DEMO / "10-bad-nvidia-visible-devices.yaml"))
    assert status == 0 and "skipped (namespace kube-system is exempt)" in out
    other = tmp_path / "cm.yaml"
    other.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}))
    status, out = run(capsys, "-f", str(other))
    assert status == 0 and "skipped (kind core/ConfigMap)" in out
