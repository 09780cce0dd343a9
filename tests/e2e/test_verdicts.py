"""The webhook's verdicts through real kubectl and a real API server: the chart installed with the
per-node-configs overlay (the demo's policy: exclusive, time-slicing, MPS and MIG configs side by side),
`gpu-stack-webhook serve` on loopback with the installed webhook configurations pointed at it."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_dev.e2e.e2elib import ROOT, E2ECluster, LiveWebhook, Release, Releases

MANIFESTS = ROOT / "hack" / "demo" / "manifests"


class Stack:
    def __init__(self, cluster: E2ECluster, release: Release, hook: LiveWebhook, namespace: str) -> None:
        self.cluster, self.release, self.hook, self.namespace = cluster, release, hook, namespace

    def kubectl(self, *args: str, input: str | None = None, cwd: Path | None = None) -> Any:
        if cwd is None:
            return self.cluster.kubectl(*args, "-n", self.namespace, input=input, check=False)
        # The README's commands name the manifest relative to hack/demo/manifests.
        import subprocess  # noqa: PLC0415

        return subprocess.run([self.cluster.kubectl_bin, *args, "-n", self.namespace], input=input, cwd=cwd,
                              capture_output=True, text=True, env=self.cluster.env, check=False, timeout=60)

    def get(self, kind: str, name: str) -> dict[str, Any]:
        return json.loads(self.cluster.kubectl("get", kind, name, "-n", self.namespace, "-o", "json").stdout)


@pytest.fixture(scope="module")
def stack(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    releases = Releases(cluster)
    hook = LiveWebhook(cluster, tmp_path_factory.mktemp("verdicts-webhook"))
    try:
        release, _ = releases.install("per-node-configs.yaml")
        namespace = cluster.create_namespace()
        releases.namespaces.append(namespace)
        hook.start(release, probe_namespace=namespace)
        yield Stack(cluster, release, hook, namespace)
    finally:
        hook.stop()
        releases.cleanup()


def expectation(path: Path) -> tuple[str, str | None]:
    header = " ".join(line.lstrip("# ") for line in path.read_text().splitlines() if line.startswith("#"))
    assert "Expected:" in header, f"{path.name}: no 'Expected: ...' in its header"
    sentence = header.split("Expected:", 1)[1].split(".")[0]
    rule = re.search(r"GPU\d{3}", sentence)
    return ("denied" if "denied" in sentence else "allowed"), (rule.group(0) if rule else None)


@pytest.mark.parametrize("manifest", sorted(p.name for p in MANIFESTS.glob("*.yaml")))
def test_demo_manifest_verdict(stack: Stack, manifest: str) -> None:
    verdict, rule = expectation(MANIFESTS / manifest)
    proc = stack.kubectl("apply", "-f", manifest, cwd=MANIFESTS)
    if verdict == "allowed":
        assert proc.returncode == 0, proc.stderr
        assert re.fullmatch(r"([a-z.]+/\S+ created\n)+", proc.stdout), proc.stdout
        assert "Error" not in proc.stderr
    else:
        assert proc.returncode == 1, proc.stdout + proc.stderr
        # The API server returns the mutating pass's warnings (e.g. GPU008's runtime class) with a later denial.
        warnings = [line for line in proc.stderr.splitlines() if line.startswith("Warning: ")]
        assert all(line.startswith("Warning: gpu-stack GPU") for line in warnings), proc.stderr
        error = "".join(line for line in proc.stderr.splitlines(keepends=True) if not line.startswith("Warning: "))
        assert re.match(rf'Error from server \(Forbidden\): error when creating "{re.escape(manifest)}": admission '
                        r'webhook "(mutate|validate)\.gpu-stack\.io" denied the request: '
                        r"(GPU\d{3} |\d GPU policy violations: \[1\] GPU\d{3} )", error), \
            proc.stderr
        assert rule in proc.stderr
        assert proc.stdout == ""


def readme_kubectl_examples() -> list[tuple[str, str]]:
    """`$ kubectl apply -f FILE` blocks of docs/policy-rules.md with the output printed below each."""
    text = (ROOT / "docs/policy-rules.md").read_text()
    examples = []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        for chunk in block.split("\n\n"):
            first, _, output = chunk.partition("\n")
            if first.startswith("$ kubectl apply -f ") and (MANIFESTS / first.split()[-1]).is_file():
                examples.append((first.split()[-1], output.strip("\n")))
    return examples


@pytest.mark.parametrize(("manifest", "printed"), readme_kubectl_examples())
def test_readme_output_is_what_kubectl_prints(stack: Stack, manifest: str, printed: str) -> None:
    stack.kubectl("delete", "-f", manifest, "--ignore-not-found", "--wait=true", cwd=MANIFESTS)
    proc = stack.kubectl("apply", "-f", manifest, cwd=MANIFESTS)
    assert (proc.stderr + proc.stdout).strip("\n") == printed


def test_readme_examples_found() -> None:
    assert len(readme_kubectl_examples()) >= 3


def test_stored_pods_carry_the_mutations(stack: Stack) -> None:
    for manifest in ("03-nvidia-mps-pod.yaml", "13-gpu-request-only.yaml"):
        stack.kubectl("apply", "-f", manifest, cwd=MANIFESTS)
    mps = stack.get("pod", "mps-nbody")["spec"]
    assert mps["hostIPC"] is True
    assert {"key": "gpu-stack.io/mps", "operator": "Exists", "effect": "NoSchedule"} in mps["tolerations"]
    request_only = stack.get("pod", "request-only")["spec"]["containers"][0]["resources"]
    assert request_only == {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}


def wait_for_pod(stack: Stack, selector: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        items = json.loads(stack.cluster.kubectl("get", "pods", "-n", stack.namespace, "-l", selector,
                                                 "-o", "json").stdout)["items"]
        if items:
            return items[0]
        assert time.monotonic() < deadline, f"no pod {selector} made by its controller"
        time.sleep(0.5)


@pytest.mark.parametrize("kind", ["Deployment", "Job"])
def test_controller_made_pods_are_judged(stack: Stack, kind: str) -> None:
    """The pods a ReplicaSet or a Job creates go through the webhook too: MPS opt-in gets injected."""
    name = f"mps-{kind.lower()}"
    template = {"metadata": {"labels": {"app": name}, "annotations": {"gpu-stack.io/mps": "true"}},
                "spec": {"restartPolicy": "Never" if kind == "Job" else "Always",
                         "containers": [{"name": "worker", "image": "busybox",
                                         "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    spec: dict[str, Any] = {"template": template}
    if kind == "Deployment":
        spec["selector"] = {"matchLabels": {"app": name}}
    api = "apps/v1" if kind == "Deployment" else "batch/v1"
    obj = {"apiVersion": api, "kind": kind, "metadata": {"name": name}, "spec": spec}
    proc = stack.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))
    assert proc.returncode == 0, proc.stderr
    pod = wait_for_pod(stack, f"app={name}")
    assert pod["metadata"]["ownerReferences"][0]["kind"] == ("ReplicaSet" if kind == "Deployment" else "Job")
    assert pod["spec"]["hostIPC"] is True
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/mps.capable": "true"}


def test_update_ephemeral_and_delete(stack: Stack) -> None:
    stack.kubectl("apply", "-f", "01-nvidia-cuda-vectoradd.yaml", cwd=MANIFESTS)
    name = yaml.safe_load((MANIFESTS / "01-nvidia-cuda-vectoradd.yaml").read_text())["metadata"]["name"]
    label = stack.kubectl("label", "pod", name, "team=ml")
    assert (label.returncode, label.stdout) == (0, f"pod/{name} labeled\n"), label.stderr
    # kubectl debug sends pods/ephemeralcontainers: a privileged debug container in a GPU pod is GPU003.
    debug = stack.kubectl("debug", name, "--image=busybox", "-c", "dbg", "--profile=sysadmin")
    assert debug.returncode == 1
    assert debug.stderr.startswith('Error from server (Forbidden): admission webhook "validate.gpu-stack.io" '
                                   "denied the request: GPU003 "), debug.stderr
    allowed = stack.kubectl("debug", name, "--image=busybox", "-c", "dbg2", "--profile=general")
    assert allowed.returncode == 0, allowed.stderr
    ephemeral = stack.get("pod", name)["spec"]["ephemeralContainers"]
    assert [c["name"] for c in ephemeral] == ["dbg2"]
    delete = stack.kubectl("delete", "pod", name, "--wait=false")
    assert (delete.returncode, delete.stdout) == (0, f'pod "{name}" deleted from {stack.namespace} namespace\n'), \
        delete.stderr


def test_kubectl_run_is_judged(stack: Stack) -> None:
    # Under the nvidia runtime class the variable would select GPUs: denied.
    proc = stack.kubectl("run", "visible", "--image=busybox", "--env=NVIDIA_VISIBLE_DEVICES=all",
                         "--overrides", json.dumps({"spec": {"runtimeClassName": "nvidia"}}))
    assert proc.returncode == 1
    assert proc.stderr.startswith('Error from server (Forbidden): admission webhook "validate.gpu-stack.io" denied '
                                  'the request: GPU002 container "visible" sets NVIDIA_VISIBLE_DEVICES'), proc.stderr
    # Without it the pod runs under runc, which reads no NVIDIA variable (the chart's runtime-class layout):
    # the webhook is not even asked (matchConditions), and the pod is created with nothing to say.
    proc = stack.kubectl("run", "plain-env", "--image=busybox", "--env=NVIDIA_VISIBLE_DEVICES=all")
    assert (proc.returncode, proc.stdout.strip(), proc.stderr) == (0, "pod/plain-env created", "")
