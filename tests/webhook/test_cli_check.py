"""`gpu-stack-webhook check`: manifests evaluated offline through the same pipeline as /mutate + /validate."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_webhook.admission.requests import admission_review
from gpu_stack_webhook.admission.review import parse_review
from gpu_stack_webhook.cli.main import main

from .podlib import GPU, claim_ref, claim_spec, container, exactly, make_pod, resource_claim, with_claims, wrap
from .recordlib import FIXTURES


def write(path: Path, *docs: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(docs), encoding="utf-8")
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["check", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def requests_only() -> dict[str, Any]:
    return make_pod([container("cuda", requests={GPU: "1"})], name="requests-only")


def privileged() -> dict[str, Any]:
    return make_pod([container("cuda", gpu=1, privileged=True)], name="privileged")


def test_a_pod_that_would_be_patched(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "pod.yaml", requests_only())
    status, out, _ = run(capsys, "-f", str(path))
    assert status == 0
    assert out.splitlines() == [
        f"pod/requests-only ({path}): patched",
        'Warning: gpu-stack GPU001: container "cuda": set GPU limit nvidia.com/gpu=1 from its request',
        "JSONPatch:",
        '  {"op":"add","path":"/spec/containers/0/resources/limits","value":{"nvidia.com/gpu":"1"}}',
    ]


def test_a_denied_pod_prints_the_kubectl_error_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "pod.yaml", privileged())
    status, out, _ = run(capsys, "-f", str(path))
    assert status == 1
    lines = out.splitlines()
    assert lines[0] == f"pod/privileged ({path}): denied"
    assert lines[1].startswith(
        f'Error from server (Forbidden): error when creating "{path}": admission webhook '
        '"validate.gpu-stack.io" denied the request: GPU003 container "cuda" is privileged'
    )


def test_the_error_line_matches_what_kubectl_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same prefix as the recorded kubectl output for the same manifest (the recording's message
    text came from a stub webhook, so only the part kubectl and the apiserver add is compared)."""
    manifest, expected = FIXTURES / "manifests" / "pod-deny.yaml", FIXTURES / "responses" / "kubectl-deny-403.txt"
    shutil.copy(manifest, tmp_path / "pod-deny.yaml")
    monkeypatch.chdir(tmp_path)
    status, out, _ = run(capsys, "-f", "pod-deny.yaml")
    assert status == 1
    recorded_error = next(line for line in expected.read_text().splitlines() if line.startswith("Error from server"))
    prefix = recorded_error[: recorded_error.index("denied the request: ") + len("denied the request: ")]
    ours = next(line for line in out.splitlines() if line.startswith("Error from server"))
    assert ours.startswith(prefix)
    assert ours[len(prefix):].startswith('GPU002 container "x" sets NVIDIA_VISIBLE_DEVICES')


def test_workload_templates_are_judged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "apps.yaml", wrap(privileged(), "Deployment"), wrap(privileged(), "CronJob"))
    status, out, _ = run(capsys, "-f", str(path))
    assert status == 1
    assert f"deployment/privileged ({path}): denied" in out
    assert f"cronjob/privileged ({path}): denied" in out
    assert "spec.jobTemplate.spec.template.spec.containers[0]" in out


def test_other_kinds_and_exempt_namespaces_are_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"a": "b"}}
    path = write(tmp_path / "mixed.yaml", cm, make_pod(name="sys", namespace="kube-system"))
    status, out, _ = run(capsys, "-f", str(path))
    assert status == 0
    assert out.splitlines() == [
        f"configmap/settings ({path}): skipped (kind core/ConfigMap)",
        f"pod/sys ({path}): skipped (namespace kube-system is exempt)",
    ]


def test_namespace_flag_applies_to_objects_without_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = privileged()
    del pod["metadata"]["namespace"]
    path = write(tmp_path / "pod.yaml", pod)
    assert run(capsys, "-f", str(path), "-n", "kube-system")[0] == 0
    assert run(capsys, "-f", str(path))[0] == 1


def test_list_items_multi_documents_and_directories(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "a.yaml", {"apiVersion": "v1", "kind": "List", "items": [make_pod(name="one"), privileged()]})
    write(tmp_path / "nested" / "b.yml", make_pod(name="two"), None, make_pod(name="three"))
    (tmp_path / "notes.txt").write_text("kind: Pod\n")
    status, out, _ = run(capsys, "-f", str(tmp_path))
    assert status == 1
    heads = [line.split(" (")[0] for line in out.splitlines() if line.startswith("pod/")]
    assert heads == ["pod/one", "pod/privileged", "pod/two", "pod/three"]


def test_several_f_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path / "a.yaml", make_pod(name="a"))
    b = write(tmp_path / "b.yaml", make_pod(name="b"))
    status, out, _ = run(capsys, "-f", str(a), "-f", str(b))
    assert status == 0
    assert out.splitlines() == [f"pod/a ({a}): allowed", f"pod/b ({b}): allowed"]


def test_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump(privileged())))
    status, out, _ = run(capsys, "-f", "-")
    assert status == 1
    assert out.startswith("pod/privileged (STDIN): denied")
    assert 'error when creating "STDIN"' in out


def test_the_policy_file_is_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "pod.yaml", privileged())
    config = tmp_path / "policy.yaml"
    config.write_text("rules:\n  disabled: [GPU003]\n")
    status, out, _ = run(capsys, "-f", str(path), "--config", str(config))
    assert status == 0
    assert out.splitlines() == [f"pod/privileged ({path}): allowed"]


# --------------------------------------------------------------------------------------------------
# Exit 2: input or config unreadable
# --------------------------------------------------------------------------------------------------


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "-f", str(tmp_path / "absent.yaml"))
    assert status == 2
    assert "absent.yaml: cannot read" in err


def test_invalid_yaml_exits_2_and_still_reports_the_rest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Pod\n  metadata: [\n")
    good = write(tmp_path / "good.yaml", privileged())
    status, out, err = run(capsys, "-f", str(bad), "-f", str(good))
    assert status == 2  # unreadable input wins over a denial: the result is incomplete
    assert "bad.yaml: not valid YAML" in err
    assert f"pod/privileged ({good}): denied" in out


def test_a_document_that_is_not_an_object_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "scalar.yaml"
    path.write_text("just a string\n")
    status, _, err = run(capsys, "-f", str(path))
    assert status == 2
    assert "document 1 is not a Kubernetes object" in err


def test_a_bad_config_names_the_key_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "pod.yaml", make_pod())
    config = tmp_path / "policy.yaml"
    config.write_text("sharing:\n  configs:\n    default:\n      flags:\n        migStrategy: sometimes\n")
    status, out, err = run(capsys, "-f", str(path), "--config", str(config))
    assert status == 2
    assert out == ""
    assert "sharing.configs.default.flags.migStrategy" in err


def test_an_empty_directory_is_not_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "-f", str(tmp_path))
    assert status == 0
    assert out == ""
    assert "no objects found" in err


# --------------------------------------------------------------------------------------------------
# The review the CLI builds
# --------------------------------------------------------------------------------------------------


def test_admission_review_is_what_the_http_path_parses() -> None:
    deployment = wrap(privileged(), "Deployment")
    del deployment["metadata"]["namespace"]
    request = parse_review(admission_review(deployment, namespace="team-a", dry_run=True))
    assert (request.group, request.version, request.kind) == ("apps", "v1", "Deployment")
    assert request.operation == "CREATE"
    assert request.namespace == "team-a"
    assert request.object is not None and request.object["metadata"]["namespace"] == "team-a"
    assert request.dry_run is True
    assert "namespace" not in deployment["metadata"]  # the input is not modified
    json.dumps(admission_review(deployment, namespace="x"))  # serialisable like a real body


@pytest.mark.parametrize("count", [".inf", "Infinity", "inf", "NaN"])
def test_infinity_is_not_a_whole_gpu_count(tmp_path: Path, capsys: pytest.CaptureFixture[str], count: str) -> None:
    # YAML `.inf` is a float infinity; "Infinity"/"NaN" strings parse as Python Decimals but are no
    # Kubernetes quantity: denied by GPU001 as not a whole number, never admitted
    text = ("apiVersion: v1\nkind: Pod\nmetadata: {name: inf}\nspec:\n  containers:\n  - name: c\n    image: x\n"
            f"    resources:\n      requests: {{nvidia.com/gpu: {count}}}\n      limits: {{nvidia.com/gpu: {count}}}\n")
    path = tmp_path / "inf.yaml"
    path.write_text(text, encoding="utf-8")
    status, out, _ = run(capsys, "-f", str(path))
    assert status != 0
    assert "GPU001" in out and "is not a whole number" in out


def test_piped_into_head_no_broken_pipe_traceback(tmp_path: Path) -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    pods = [make_pod([container("cuda", gpu=1)], name=f"p{i}") for i in range(400)]
    path = write(tmp_path / "many.yaml", *pods)
    script = (f"{sys.executable} -c 'from gpu_stack_webhook.cli.main import main; import sys; "
              f"sys.exit(main([\"check\", \"-f\", \"{path}\"]))' | head -n 1")
    done = subprocess.run(["bash", "-c", f"set -o pipefail; {script}"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.stdout.startswith("pod/p0 ")
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr


def test_a_pods_claims_are_read_from_the_same_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`check` resolves a pod's ResourceClaim / ResourceClaimTemplate from the other documents of the file."""
    gpu = resource_claim(claim_spec(exactly()), name="one-gpu", namespace="gpu-demo", template=True)
    nic = resource_claim(claim_spec(exactly("nic", "nic.example.com")), name="nic", namespace="gpu-demo")

    def claimed(claim: dict[str, Any]) -> dict[str, Any]:
        return make_pod([with_claims(container("cuda", privileged=True), "c")], name="claimed",
                        resourceClaims=[claim_ref("c", template="one-gpu")] if claim is gpu
                        else [claim_ref("c", claim="nic")])

    status, out, _ = run(capsys, "-f", str(write(tmp_path / "gpu.yaml", gpu, claimed(gpu))))
    assert status == 1
    assert ('GPU003 container "cuda" is privileged in a pod holding GPUs by claim "c" (ResourceClaimTemplate '
            '"one-gpu")') in out
    status, out, _ = run(capsys, "-f", str(write(tmp_path / "nic.yaml", nic, claimed(nic))))
    assert status == 0, out
    # Not in the input: it cannot be read, so fail closed, saying so.
    status, out, _ = run(capsys, "-f", str(write(tmp_path / "alone.yaml", nic, claimed(gpu))))
    assert status == 1 and "ResourceClaimTemplate gpu-demo/one-gpu is not in the input" in out
