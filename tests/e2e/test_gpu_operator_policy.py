"""gpu-stack's policy-only mode beside the real GPU Operator v26.7.0 controller (gpu_stack_dev.e2e.gpu_operator),
in a namespace other than `gpu-operator`: gpu-stack installed first with Chart-values-examples/
policy-only-gpu-operator.yaml, its webhook served on loopback as the chart's ServiceAccount with the flags the
chart's Deployment renders; then the operator's ClusterPolicy applied.

What a user meets on day one: the operator's privileged DaemonSets and their pods (runtimeClassName nvidia, then
NRI annotations) are admitted as the operator's, created and re-created with no FailedCreate; a user's pods are
judged as docs/gpu-operator.md's verdict table says (gpu_stack_dev/operator_cases.py, the same cases), in CDI mode
and after the switch to NRI mode; a user's copy of an operand in the operator's namespace is refused.
"""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpu_stack_dev import operator_cases
from gpu_stack_dev.e2e.e2elib import E2ECluster, LiveWebhook, Release, Releases
from gpu_stack_dev.e2e.gpu_operator import GpuOperator

from .test_gpu_operator_real import WITH_PODS
from .test_tls_selfmanaged import sa_kubeconfig

DENIED = '"validate.gpu-stack.io" denied the request: '
# The webhook reads the ClusterPolicy and the RuntimeClasses every second here (--policy-source-interval 1s).
FOLLOW_SECONDS = 30
# The chart Deployment's flags that choose what the webhook reads from the cluster.
SOURCE_FLAGS = ("--cluster-lookups", "--policy-source", "--cluster-policy", "--operator-namespace",
                "--operator-service-account", "--runtime-classes")


class Stack:
    """gpu-stack policy-only, its webhook live, a namespace for users' pods, the admin's RuntimeClasses."""

    def __init__(self, operator: GpuOperator, releases: Releases, workdir: Path) -> None:
        self.operator, self.cluster = operator, operator.cluster
        self.release: Release
        self.release, _ = releases.install("policy-only-gpu-operator.yaml", set_json={
            "webhook.policySource.gpuOperator.namespace": operator.namespace})
        self.users = self.cluster.create_namespace()
        for name, handler in operator_cases.ADMIN_RUNTIME_CLASSES.items():
            runtime_class = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name},
                             "handler": handler}
            self.cluster.kubectl("apply", "-f", "-", input=json.dumps(runtime_class))
        self.webhook = LiveWebhook(self.cluster, workdir)
        kubeconfig = sa_kubeconfig(self.cluster, self.release, workdir / "sa.kubeconfig")
        self.webhook.start(self.release, extra_args=[*self.chart_flags(), "--kubeconfig", str(kubeconfig),
                                                     "--policy-source-interval", "1s", "--log-level", "debug"],
                         probe_namespace=self.users)

    def chart_flags(self) -> list[str]:
        deployment = self.cluster.get_json("deployment", f"{self.release.fullname}-webhook", "-n",
                                           self.release.namespace)
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        flags: list[str] = []
        for index, arg in enumerate(args):
            if arg in SOURCE_FLAGS:
                flags.append(arg)
                if arg != "--cluster-lookups":
                    flags.append(args[index + 1])
        assert "--runtime-classes" in flags and "--operator-service-account" in flags, args
        return flags

    def stop(self) -> None:
        self.webhook.stop()
        for name in operator_cases.ADMIN_RUNTIME_CLASSES:
            self.cluster.kubectl("delete", "runtimeclass", name, "--ignore-not-found", check=False)

    def verdict(self, manifest: dict[str, Any], namespace: str = "") -> str:
        """`allowed`, `denied: GPU0xx, ...` (the webhook's rules), or the API server's own refusal."""
        proc = self.cluster.kubectl("create", "--dry-run=server", "-n", namespace or self.users, "-f", "-",
                                    input=json.dumps(manifest), check=False)
        if proc.returncode == 0:
            return "allowed"
        if DENIED in proc.stderr:
            return "denied: " + ", ".join(sorted(set(re.findall(r"\bGPU0\d\d\b", proc.stderr.split(DENIED, 1)[1]))))
        if re.search(r'RuntimeClass "[^"]+" not found', proc.stderr):
            return operator_cases.NO_RUNTIME_CLASS
        return proc.stderr.strip()

    def verdicts(self) -> dict[str, str]:
        return {case.name: self.verdict(case.pod()) for case in operator_cases.CASES}

    def until_verdicts(self, expected: dict[str, str]) -> dict[str, str]:
        """The verdicts once they are `expected` (the webhook follows a change within seconds), else the last."""
        deadline = time.monotonic() + FOLLOW_SECONDS
        seen = self.verdicts()
        while seen != expected and time.monotonic() < deadline:
            time.sleep(1)
            seen = self.verdicts()
        return seen


@pytest.fixture(scope="module")
def stack(gpu_operator: GpuOperator, cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    releases = Releases(cluster)
    setup = Stack(gpu_operator, releases, tmp_path_factory.mktemp("gpu-stack-beside-operator"))
    try:
        yield setup
    finally:
        setup.stop()
        releases.cleanup()


def no_failed_creates(operator: GpuOperator) -> list[str]:
    return [f"{e.daemonset}: {e.message}" for e in operator.failed_creates()]


def test_installed_before_the_operator_its_pods_are_admitted(stack: Stack) -> None:
    operator = stack.operator
    operator.prepare_node()
    operator.apply_cluster_policy()
    assert set(operator.wait_runtime_classes(present=True)) == set(operator_cases.OPERATOR_RUNTIME_CLASSES)
    pods = operator.wait_pods_created(WITH_PODS, timeout=120)
    assert {name: pod["spec"].get("runtimeClassName") for name, [pod] in pods.items()} == {
        "nvidia-driver-daemonset": None, "nvidia-container-toolkit-daemonset": None,
        "nvidia-operator-validator": "nvidia", "nvidia-device-plugin-daemonset": "nvidia",
        "nvidia-dcgm-exporter": "nvidia", "gpu-feature-discovery": "nvidia"}
    assert no_failed_creates(operator) == []
    # The webhook was asked, and admitted them as the operator's (its decision log, --log-level debug).
    log = stack.webhook.log()
    for name in ("nvidia-operator-validator", "nvidia-device-plugin-daemonset", "gpu-feature-discovery"):
        assert f"the GPU Operator's own: a pod of DaemonSet {name}, which ClusterPolicy cluster-policy" in log, name
    assert "the GPU Operator's own: written by the GPU Operator for ClusterPolicy cluster-policy" in log


def test_deleted_operand_pods_come_back_through_admission(stack: Stack) -> None:
    operator = stack.operator
    before = {name: pod["metadata"]["uid"] for name, [pod] in operator.wait_pods_created(WITH_PODS).items()}
    stack.cluster.kubectl("delete", "pods", "--all", "-n", operator.namespace, "--wait=false")
    deadline = time.monotonic() + 120
    while True:
        now = {name: pod["metadata"]["uid"] for name, [pod] in operator.wait_pods_created(WITH_PODS).items()}
        if all(now[name] != before[name] for name in WITH_PODS) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert all(now[name] != before[name] for name in WITH_PODS), (before, now)
    assert no_failed_creates(operator) == []


def test_users_pods_are_judged_as_the_docs_table_says(stack: Stack) -> None:
    assert stack.until_verdicts(operator_cases.expected()) == operator_cases.expected()


def test_a_users_copy_of_an_operand_in_the_operators_namespace_is_refused(stack: Stack) -> None:
    """The device plugin's pod as a user would copy it (privileged, NVIDIA_VISIBLE_DEVICES=all, runtime class
    nvidia, even naming the operator's DaemonSet as its owner) is not the operator's: it is judged."""
    operator = stack.operator
    daemonset = copy.deepcopy(operator.daemonsets()["nvidia-device-plugin-daemonset"])
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "not-the-operators", "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "DaemonSet", "name": daemonset["metadata"]["name"],
            "uid": daemonset["metadata"]["uid"], "controller": True}]},
        "spec": daemonset["spec"]["template"]["spec"]}
    assert stack.verdict(pod, operator.namespace) == "denied: GPU002, GPU003, GPU011"
    copied = {"apiVersion": "apps/v1", "kind": "DaemonSet",
              "metadata": {"name": "copied", "ownerReferences": daemonset["metadata"]["ownerReferences"]},
              "spec": daemonset["spec"]}
    assert stack.verdict(copied, operator.namespace) == "denied: GPU002, GPU003, GPU011"


def test_nri_mode_the_operators_annotated_pods_are_admitted_and_users_judged(stack: Stack) -> None:
    operator = stack.operator
    operator.switch_to_nri()
    assert operator.wait_runtime_classes(present=False) == {}

    def annotated(pods: list[dict[str, Any]]) -> bool:
        return any(k.startswith("nvidia.cdi.k8s.io/") for p in pods for k in p["metadata"].get("annotations", {}))

    deadline = time.monotonic() + 120
    while not annotated(operator.pods_of(operator.daemonsets()["nvidia-device-plugin-daemonset"])):
        assert time.monotonic() < deadline, no_failed_creates(operator)
        time.sleep(1)
    pods = operator.wait_pods_created(WITH_PODS, timeout=120)
    assert all("runtimeClassName" not in pod["spec"] for [pod] in pods.values())
    assert no_failed_creates(operator) == []
    assert stack.until_verdicts(operator_cases.expected(nri=True)) == operator_cases.expected(nri=True)
