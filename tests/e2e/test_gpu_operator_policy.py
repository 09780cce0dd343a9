"""gpu-stack's policy-only mode beside the real GPU Operator v26.7.0 controller (gpu_stack_dev.e2e.gpu_operator),
in a namespace other than `gpu-operator`: gpu-stack installed first with Chart-values-examples/
policy-only-gpu-operator.yaml, its webhook served on loopback as the chart's ServiceAccount with the flags the
chart's Deployment renders; then the operator's ClusterPolicy applied.

What a user meets on day one: the operator's privileged DaemonSets and their pods (runtimeClassName nvidia, then
NRI annotations) are admitted as the operator's, created and re-created with no FailedCreate; a user's pods are
judged as docs/gpu-operator.md's verdict table says (gpu_stack_dev/operator_cases.py, the same cases), in CDI mode
and after the switch to NRI mode; a user's copy of an operand in the operator's namespace is refused.
The validator's own workload pods (built from its manifests at the tag, sent as its ServiceAccount) are admitted
in CDI and NRI mode, copies and forged owners are refused, and the operator's objects cannot be borrowed
(docs/gpu-operator.md, "The operator's own pods").
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

from .minors_results import record_session
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
        self.last_refusal = ""
        # A namespace editor of the operator's namespace (ClusterRole edit, bound there).
        self.cluster.kubectl("create", "serviceaccount", "editor", "-n", operator.namespace)
        self.cluster.kubectl("create", "rolebinding", "editor", "-n", operator.namespace, "--clusterrole=edit",
                             f"--serviceaccount={operator.namespace}:editor")
        self.editor = f"system:serviceaccount:{operator.namespace}:editor"
        # A user's copy of the validator's pods names its ServiceAccount: one of that name in the user's namespace.
        self.cluster.kubectl("create", "serviceaccount", "nvidia-operator-validator", "-n", self.users)
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

    def verdict(self, manifest: dict[str, Any], namespace: str = "", as_user: str = "") -> str:
        """`allowed`, `denied: GPU0xx, ...` (the webhook's rules), or the API server's own refusal; sent by the
        admin, or as `as_user` (impersonation: the webhook sees that user in userInfo)."""
        proc = self.cluster.kubectl("create", "--dry-run=server", "-n", namespace or self.users, "-f", "-",
                                    *((f"--as={as_user}",) if as_user else ()), input=json.dumps(manifest), check=False)
        self.last_refusal = proc.stderr.split(DENIED, 1)[1] if DENIED in proc.stderr else ""
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


VALIDATOR = "nvidia-operator-validator"
DS_CONTROLLER = "system:serviceaccount:kube-system:daemon-set-controller"
BORROWED = "passes as the GPU Operator's"


def validator_sa(stack: Stack) -> str:
    return f"system:serviceaccount:{stack.operator.namespace}:{VALIDATOR}"


def validators_pods_are_its_own(stack: Stack, runtime_class: str | None) -> None:
    """The validator's CUDA and device-plugin workload pods, built from the manifests at the tag as it fills them
    (GpuOperator.validation_pod), sent as its ServiceAccount: admitted as its own; the same pods sent by anyone
    else, in the operator's namespace or a user's, are refused."""
    operator, ns = stack.operator, stack.operator.namespace
    for component in ("cuda", "plugin"):
        pod = operator.validation_pod(component, operator.nodes[0])
        assert pod["spec"].get("runtimeClassName") == runtime_class
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "ClusterPolicy"
        assert stack.verdict(pod, ns, as_user=validator_sa(stack)) == "allowed", (component, stack.last_refusal)
        for as_user, namespace in (("", ns), ("", stack.users), (stack.editor, ns), (DS_CONTROLLER, ns)):
            copied = {**pod, "metadata": {**pod["metadata"], "namespace": namespace}}
            verdict = stack.verdict(copied, namespace, as_user=as_user)
            assert verdict.startswith("denied"), (component, as_user, namespace, verdict)
            assert BORROWED in stack.last_refusal, (component, as_user, namespace, stack.last_refusal)
    log = stack.webhook.log()
    assert ("the GPU Operator's own: a validation pod of the GPU Operator's validator, owned as DaemonSet "
            f"{VALIDATOR} is, which ClusterPolicy cluster-policy controls") in log


def test_cdi_mode_the_validators_own_pods_are_admitted_and_copies_refused(stack: Stack) -> None:
    validators_pods_are_its_own(stack, "nvidia")


def test_the_validators_pods_with_forged_owners_are_refused(stack: Stack) -> None:
    operator, ns = stack.operator, stack.operator.namespace
    wrong_uid = operator.validation_pod("cuda", operator.nodes[0])
    wrong_uid["metadata"]["ownerReferences"][0]["uid"] = "00000000-0000-0000-0000-000000000000"
    verdict = stack.verdict(wrong_uid, ns, as_user=validator_sa(stack))
    assert verdict.startswith("denied: ") and {"GPU002", "GPU003"} <= set(verdict[8:].split(", ")), verdict
    assert "(its controller is ClusterPolicy cluster-policy)" in stack.last_refusal
    # A DaemonSet the ClusterPolicy does not control (anyone's), and the validator's own DaemonSet: neither is
    # what the validator copies onto its pods (its DaemonSet's owner references).
    plain = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "not-the-operators"}, "spec": {
        "selector": {"matchLabels": {"app": "not-the-operators"}}, "template": {
            "metadata": {"labels": {"app": "not-the-operators"}}, "spec": {
                "nodeSelector": {"gpu-stack.io/nowhere": "true"},
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}}}}
    stack.cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(plain))
    try:
        daemonsets = operator.daemonsets()
        for owner in (daemonsets["not-the-operators"], daemonsets[VALIDATOR]):
            pod = operator.validation_pod("cuda", operator.nodes[0])
            pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "controller": True,
                                                   "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}]
            verdict = stack.verdict(pod, ns, as_user=validator_sa(stack))  # judged as any user's pod
            assert verdict.startswith("denied: ") and {"GPU002", "GPU003"} <= set(verdict[8:].split(", ")), verdict
    finally:
        stack.cluster.kubectl("delete", "daemonset", "not-the-operators", "-n", ns, "--ignore-not-found")


def test_the_operators_objects_cannot_be_borrowed(stack: Stack) -> None:
    """A DaemonSet or pod the rules would admit (one GPU, `one-gpu` in the docs' table) that claims the
    ClusterPolicy or an operator DaemonSet is refused; a namespace editor's change of an operand DaemonSet's
    template is refused (its labels are not), so the pods the DaemonSet controller creates stay those of the
    operator's template."""
    operator, ns = stack.operator, stack.operator.namespace
    plugin = operator.daemonsets()["nvidia-device-plugin-daemonset"]
    one_gpu = next(c for c in operator_cases.CASES if c.name == "one-gpu").pod()
    harmless = one_gpu["spec"]
    assert stack.verdict(one_gpu, ns, as_user=stack.editor) == "allowed"  # the same, claiming nothing
    forged_ds = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {
        "name": "forged", "ownerReferences": plugin["metadata"]["ownerReferences"]}, "spec": {
        "selector": {"matchLabels": {"app": "forged"}},
        "template": {"metadata": {"labels": {"app": "forged"}}, "spec": harmless}}}
    for as_user in ("", stack.editor):
        assert stack.verdict(forged_ds, ns, as_user=as_user) == "denied: ", as_user
        assert stack.last_refusal.startswith(
            f"gpu-stack: DaemonSet {ns}/forged passes as the GPU Operator's (its controller is ClusterPolicy "
            f"cluster-policy); only the GPU Operator's ServiceAccount system:serviceaccount:{ns}:gpu-operator, in "
            f"namespace {ns}, may create it"), stack.last_refusal
    forged_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "forged", "ownerReferences": [{
        "apiVersion": "apps/v1", "kind": "DaemonSet", "name": plugin["metadata"]["name"],
        "uid": plugin["metadata"]["uid"], "controller": True}]}, "spec": harmless}
    assert stack.verdict(forged_pod, ns, as_user=stack.editor) == "denied: "
    assert ("(its controller is DaemonSet nvidia-device-plugin-daemonset, which ClusterPolicy cluster-policy "
            "controls)") in stack.last_refusal
    # The editor swaps the device plugin's image and command (not a dry run): refused.
    image = plugin["spec"]["template"]["spec"]["containers"][0]["image"]
    patch = {"spec": {"template": {"spec": {"containers": [{
        "name": plugin["spec"]["template"]["spec"]["containers"][0]["name"], "image": "registry.k8s.io/pause:3.10",
        "command": ["/pause"]}]}}}}
    proc = stack.cluster.kubectl("patch", "daemonset", "nvidia-device-plugin-daemonset", "-n", ns,
                                 f"--as={stack.editor}", "--type=strategic", "-p", json.dumps(patch), check=False)
    assert proc.returncode != 0 and DENIED in proc.stderr, proc.stderr
    assert f"may change its spec, not {stack.editor}" in proc.stderr
    assert "GPU003" in proc.stderr  # judged in full: what the template already had counts too
    # Its labels are the editor's to change; the template, and the pods created from it, stay the operator's.
    stack.cluster.kubectl("label", "daemonset", "nvidia-device-plugin-daemonset", "-n", ns, f"--as={stack.editor}",
                          "team=infra")
    now = operator.daemonsets()["nvidia-device-plugin-daemonset"]
    assert now["metadata"]["labels"]["team"] == "infra"
    assert now["spec"]["template"] == plugin["spec"]["template"]
    pods = operator.wait_pods_created(["nvidia-device-plugin-daemonset"])
    assert [p["spec"]["containers"][0]["image"] for p in pods["nvidia-device-plugin-daemonset"]] == [image]
    stack.cluster.kubectl("label", "daemonset", "nvidia-device-plugin-daemonset", "-n", ns, "team-")
    assert no_failed_creates(operator) == []
    # With test_installed_before_the_operator_its_pods_are_admitted: the 1.36 cell of the support table's row
    # (tests/e2e/test_kubernetes_minors.py runs the two on 1.32 and 1.34).
    record_session(stack.cluster, "beside the GPU Operator", "yes")


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


def test_nri_mode_the_validators_own_pods_are_admitted_and_copies_refused(stack: Stack) -> None:
    stack.operator.wait_daemonsets([VALIDATOR],
                                   check=lambda ds: "runtimeClassName" not in ds["spec"]["template"]["spec"])
    validators_pods_are_its_own(stack, None)
