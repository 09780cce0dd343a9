"""The commands README.md, the chart README, docs/ and NOTES show a user, typed against a real API server:
the install lines as they stand (an image placeholder filled in), the kubectl lines against the release
they install, the upgrades, the uninstall; and NOTES' post-install check, rendered for the installed
release, refused as NOTES says. A line that cannot run here says why (NOT_RUN); its flags are checked by
tests/docs/test_doc_commands.py all the same. The line that names `<overlay>` runs with one overlay
(per-node-configs): test_install.py installs every overlay the same way. A failure names the file and line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_stack_dev.e2e.admission_policies import wait_not_enforced
from gpu_stack_dev.e2e.e2elib import FAKE_WEBHOOK_IMAGE, E2ECluster, Release, Releases

from tests.docs.doccommands import ROOT, Command, doc_commands, notes_commands

RELEASE, NAMESPACE = "gpu-stack", "gpu-stack"  # what the documents type
NODE = "docs-gpu-node"

# Why a documented line does not run on the e2e plane (no kubelet, nothing runs in a pod).
NOT_RUN: list[tuple[Callable[[list[str]], bool], str]] = [
    (lambda w: w[:2] == ["helm", "test"], "helm test runs pods, and no kubelet runs them here"),
    (lambda w: "logs" in w[1:3], "reads a container's log, and no container runs here"),
    (lambda w: "-w" in w or "--watch" in w, "watches until interrupted"),
    (lambda w: w[:3] == ["kubectl", "delete", "-f"], "deletes the NFD CRDs the session's other installs share"),
    (lambda w: any(word.startswith("servicemonitor") for word in w),
     "needs the Prometheus Operator's CRDs (the monitoring overlay)"),
    (lambda w: any(word.startswith("clusterpolicies.nvidia.com") for word in w),
     "needs the GPU Operator's ClusterPolicy CRD; tests/e2e/test_gpu_operator_policy.py runs beside the operator"),
    (lambda w: "--usage" in w or "--idle" in w,
     "reads dcgm-exporter's series from a Prometheus; tests/e2e/test_inspect_usage_e2e.py runs it beside a real one"),
    (lambda w: any(word.startswith("oci://") for word in w),
     "pulls the chart from a public registry; tests/e2e/node/test_registry.py installs a release from one of its own"),
    (lambda w: w[0] not in ("kubectl", "helm"), "runs on a build machine or a GPU node, not against the cluster"),
]
# Placeholders only a person fills in, from an alert or a running pod.
FROM_A_PERSON = ("<pod from the alert>", "<device plugin pod on the node>")


def why_not_run(command: Command) -> str | None:
    if command.example:
        return "an example whose output its own test reproduces (test_verdicts, test_cel_policies, inspect)"
    if any(p in command.text for p in FROM_A_PERSON):
        return "names an object only an alert or a running pod gives"
    words = command.words()
    return next((reason for test, reason in NOT_RUN if test(words)), None)


def run(cluster: E2ECluster, command: Command, **extra: str) -> subprocess.CompletedProcess[str]:
    """The command as typed, from the repository root, with the session's kubectl, Helm 4 and kubeconfig;
    kubectl finds this repository's plugin (kubectl-gpu_stack) on PATH as it would after `pip install`."""
    words = command.typed({"<node>": NODE, **extra})
    binary = {"kubectl": cluster.kubectl_bin, "helm": cluster.helm4_bin}[words[0]]
    env = {**cluster.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{cluster.env.get('PATH', '')}"}
    return subprocess.run([binary, *words[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def publish_node(cluster: E2ECluster) -> None:
    """A Node for the documents' `<node>`: labels and taints are what they change; nothing runs on it."""
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
            "spec": {"taints": [{"key": "e2e.gpu-stack.io/fleet", "effect": "NoSchedule"}]}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(node))


def notes_check(cluster: E2ECluster, release: Release) -> tuple[Command, str]:
    """NOTES' post-install check as `helm get notes` prints it for the installed release, and the answer it
    says to expect."""
    notes = cluster.helm("get", "notes", release.name, "-n", release.namespace).stdout
    (command,) = [c for c in notes_commands(notes, f"release {release.name}") if c.words()[:2] == ["kubectl", "run"]]
    lines = notes.splitlines()
    expected = lines[next(i for i, line in enumerate(lines) if line.strip() == command.text) + 1].strip()
    assert expected.startswith("# -> "), expected
    return command, expected.removeprefix("# -> ")


def denied_as_expected(proc: subprocess.CompletedProcess[str], expected: str) -> bool:
    """`expected` is NOTES' line: its parts around each `...` appear in that order in kubectl's error."""
    if proc.returncode == 0:
        return False
    position = 0
    for part in (p.strip() for p in expected.split("...") if p.strip()):
        found = proc.stderr.find(part, position)
        if found < 0:
            return False
        position = found + len(part)
    return True


def test_the_notes_check_is_denied_by_the_installed_webhook(cluster: E2ECluster, releases: Releases,
                                                             live_webhook: Any) -> None:
    release, _ = releases.install()
    live_webhook(release, probe_namespace=cluster.create_namespace())
    command, expected = notes_check(cluster, release)
    assert 'admission webhook "validate.gpu-stack.io" denied the request: GPU002' in expected
    proc = run(cluster, command)
    assert denied_as_expected(proc, expected), f"{command.where}: {command.text}\n{proc.stdout}{proc.stderr}"


def test_the_notes_check_is_denied_by_the_cel_policy(cluster: E2ECluster, releases: Releases) -> None:
    release, _ = releases.install(set_json={"webhook.validation.mode": "cel", "webhook.mutation.mode": "cel"},
                                  webhook_image=None)
    try:
        command, expected = notes_check(cluster, release)
        assert "ValidatingAdmissionPolicy" in expected
        deadline = time.monotonic() + 60  # the API server compiles a new policy before it enforces it
        while not denied_as_expected(proc := run(cluster, command), expected) and time.monotonic() < deadline:
            time.sleep(1)
        assert denied_as_expected(proc, expected), f"{command.where}: {command.text}\n{proc.stdout}{proc.stderr}"
    finally:  # the next test installs the chart with the webhook: not under this release's policies
        releases.cleanup()
        wait_not_enforced(cluster)


def test_the_documented_commands_work_as_typed(cluster: E2ECluster, releases: Releases) -> None:
    """No webhook answers here: none of these lines creates a pod (NOTES' check, which does, is the two tests
    above), and helm upgrade must meet the webhook configurations as it rendered them."""
    commands = doc_commands()
    failures: list[str] = []
    ran: list[Command] = []

    def attempt(command: Command, **extra: str) -> subprocess.CompletedProcess[str]:
        proc = run(cluster, command, **extra)
        ran.append(command)
        if proc.returncode != 0:
            failures.append(f"{command.where}: {command.text}\n  exit {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def lines(test: Callable[[list[str]], bool]) -> list[Command]:
        return [c for c in commands if c.tool in ("kubectl", "helm") and test(c.words())]

    installs = lines(lambda w: w[:2] == ["helm", "install"])
    image_install = next(c for c in installs if "webhook.image.repository=registry.example.com" in c.text)
    uninstall = next(c for c in lines(lambda w: w[:2] == ["helm", "uninstall"]))
    delete_namespace = next(c for c in lines(lambda w: w[:3] == ["kubectl", "delete", "namespace"]))
    release = Release(RELEASE, NAMESPACE, 4, FAKE_WEBHOOK_IMAGE)
    releases.installed.append(release)  # uninstalled at teardown should a step below fail
    releases.namespaces.append(NAMESPACE)
    publish_node(cluster)
    try:
        assert attempt(image_install).returncode == 0, failures
        notes = cluster.helm("get", "notes", RELEASE, "-n", NAMESPACE).stdout
        everyday = [c for c in [*commands, *notes_commands(notes, f"release {RELEASE}")]
                    if c.tool == "kubectl" and why_not_run(c) is None
                    and c.words()[1:3] != ["delete", "namespace"] and c.words()[1] != "run"]
        for command in everyday:
            attempt(command)
        for command in lines(lambda w: w[:2] == ["helm", "upgrade"]):
            if why_not_run(command) is None:
                attempt(command)
        attempt(uninstall)
        attempt(delete_namespace)
        for command in installs:
            if command is image_install or why_not_run(command) is not None:
                continue
            attempt(command, **{"<overlay>": "per-node-configs"})
            attempt(uninstall)
    finally:
        cluster.kubectl("delete", "node", NODE, "--ignore-not-found")
        for binding in ("clusterrolebinding", "rolebinding"):
            cluster.kubectl("delete", binding, "gpu-users-inspect", "-n", NAMESPACE, "--ignore-not-found", check=False)
    assert failures == [], "documented commands that fail as typed:\n" + "\n".join(failures)
    assert image_install in ran and uninstall in ran
