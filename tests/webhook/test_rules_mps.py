"""GPU006 mps-pod-injection: MPS pods get hostIPC, the MPS tolerations and (annotation opt-in) the MPS nodeSelector."""

from __future__ import annotations

from typing import Any

import pytest
from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.findings import Severity

from .podlib import CONTAINER_KINDS, GPU, SPEC_PATH, WORKLOAD_KINDS, apply_patch, container, make_pod, pod_with, wrap
from .policylib import CONFIG_LABEL, config_default, config_mps, config_per_node, decide, findings, only, rule_patch

RULE = "GPU006"
MPS_LABEL = "nvidia.com/mps.capable"
ANNOTATION = "gpu-stack.io/mps"
TOL = {"key": "gpu-stack.io/mps", "operator": "Exists", "effect": "NoSchedule"}
HOST_IPC = {"op": "add", "path": "/spec/hostIPC", "value": True}
ADD_TOLS = {"op": "add", "path": "/spec/tolerations", "value": [TOL]}
APPEND_TOL = {"op": "add", "path": "/spec/tolerations/-", "value": TOL}
ADD_SELECTOR = {"op": "add", "path": "/spec/nodeSelector", "value": {MPS_LABEL: "true"}}
# What DefaultTolerationSeconds has always added by the time /mutate is called (see the recorded requests).
DEFAULT_TOLS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
]

MPS = config_mps()
DEFAULT = config_default()
PER_NODE = config_per_node()


def required(key: str, *values: str, op: str = "In") -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": op, "values": list(values)}]}]}}}


def gpu_pod(**kw: Any) -> dict[str, Any]:
    return make_pod([container("cuda", gpu=1)], **kw)


def changes(pod: dict[str, Any], config: PolicyConfig) -> dict[str, Any]:
    """The pod after GPU006's patch on its CREATE at /mutate."""
    return apply_patch(pod, rule_patch(pod, RULE, config))


# (config, pod, what the reason in the message names (None: not an MPS pod), ops with the effect of the patch)
DETECTION = [
    # every node shares nvidia.com/gpu through MPS: a GPU pod is an MPS pod
    pytest.param(MPS, gpu_pod(), "nvidia.com/gpu is MPS-shared", [HOST_IPC, ADD_TOLS], id="resource-mps-everywhere"),
    # a non-GPU pod on an MPS cluster is not an MPS pod
    pytest.param(MPS, make_pod([container("app")]), None, [], id="non-gpu-pod-not-mps"),
    # exclusive GPUs everywhere: not MPS
    pytest.param(DEFAULT, gpu_pod(), None, [], id="exclusive-not-mps"),
    # nodeSelector on the MPS node label -> MPS pod
    pytest.param(DEFAULT, gpu_pod(nodeSelector={MPS_LABEL: "true"}), f"{MPS_LABEL}=true",
                 [HOST_IPC, ADD_TOLS], id="nodeSelector-mps-label"),
    # the MPS label with another value selects non-MPS nodes -> not MPS
    pytest.param(DEFAULT, gpu_pod(nodeSelector={MPS_LABEL: "false"}), None, [], id="nodeSelector-mps-label-false"),
    # required affinity In ["true"] on the MPS label -> MPS pod
    pytest.param(DEFAULT, gpu_pod(affinity=required(MPS_LABEL, "true")), f"affinity on {MPS_LABEL}",
                 [HOST_IPC, ADD_TOLS], id="affinity-mps-label"),
    # affinity Exists on the label does not select MPS nodes specifically -> not MPS
    pytest.param(DEFAULT, gpu_pod(affinity=required(MPS_LABEL, op="Exists")), None, [], id="affinity-exists-not-mps"),
    # nodeSelector naming an MPS device plugin config -> MPS pod
    pytest.param(PER_NODE, gpu_pod(nodeSelector={CONFIG_LABEL: "mps-x10"}), f"{CONFIG_LABEL}=mps-x10",
                 [HOST_IPC, ADD_TOLS], id="nodeSelector-config-label-mps"),
    # affinity In [mps-x10] on the config label -> MPS pod
    pytest.param(PER_NODE, gpu_pod(affinity=required(CONFIG_LABEL, "mps-x10")), f"affinity on {CONFIG_LABEL}",
                 [HOST_IPC, ADD_TOLS], id="affinity-config-label-mps"),
    # nodeSelector naming a time-slicing config -> not MPS
    pytest.param(PER_NODE, gpu_pod(nodeSelector={CONFIG_LABEL: "ts-x4"}), None, [], id="nodeSelector-config-ts"),
    # unpinned on per-node configs: may land on exclusive nodes -> not MPS
    pytest.param(PER_NODE, gpu_pod(), None, [], id="per-node-unpinned-not-mps"),
    # annotation opt-in: hostIPC, toleration and the MPS nodeSelector
    pytest.param(DEFAULT, gpu_pod(annotations={ANNOTATION: "true"}), f"annotation {ANNOTATION}",
                 [HOST_IPC, ADD_TOLS, ADD_SELECTOR], id="annotation-true"),
    # the annotation value is case-insensitive
    pytest.param(DEFAULT, gpu_pod(annotations={ANNOTATION: "True"}), f"annotation {ANNOTATION}",
                 [HOST_IPC, ADD_TOLS, ADD_SELECTOR], id="annotation-True"),
    # "false" (or anything but true) does not opt in
    pytest.param(DEFAULT, gpu_pod(annotations={ANNOTATION: "false"}), None, [], id="annotation-false"),
    pytest.param(DEFAULT, gpu_pod(annotations={ANNOTATION: "yes"}), None, [], id="annotation-yes"),
]


@pytest.mark.parametrize(("config", "pod", "reason", "ops"), DETECTION)
def test_mps_detection_and_injection(config: PolicyConfig, pod: dict[str, Any], reason: str | None,
                                     ops: list[dict[str, Any]]) -> None:
    found = findings(pod, RULE, config=config, can_patch=True)
    patched = apply_patch(pod, ops)
    assert changes(pod, config) == patched
    assert (rule_patch(pod, RULE, config) == []) is (ops == [])
    for f in found:
        assert f.severity is Severity.WARN and f.changed
        assert reason in f.message
    if reason is None:
        assert found == []
    # idempotent: the webhook reinvoked on its own output adds nothing
    assert rule_patch(patched, RULE, config) == []


@pytest.mark.parametrize("field", CONTAINER_KINDS)
def test_mps_by_resource_in_any_container_kind(field: str) -> None:
    # the MPS-shared GPU is requested by an init/ephemeral container only: still an MPS pod
    pod = pod_with(field, container("x", gpu=1))
    assert changes(pod, MPS) == apply_patch(pod, [HOST_IPC, ADD_TOLS])


# (tolerations field of the pod spec (absent when "absent"), config overrides of mps, ops with the patch's effect)
TOLERATIONS = [
    # no tolerations array: add the whole array
    pytest.param("absent", {}, [ADD_TOLS], id="absent-add-array"),
    # tolerations: null behaves like absent
    pytest.param(None, {}, [ADD_TOLS], id="null-add-array"),
    # an empty array exists: append with /-
    pytest.param([], {}, [APPEND_TOL], id="empty-append"),
    # DefaultTolerationSeconds' tolerations present (the real case): append, keep theirs
    pytest.param(DEFAULT_TOLS, {}, [APPEND_TOL], id="default-tolerations-append"),
    # the same toleration already there: nothing
    pytest.param([dict(TOL)], {}, [], id="equal-present"),
    # same toleration with fields in another order and an explicit tolerationSeconds-free shape: nothing
    pytest.param([{"effect": "NoSchedule", "operator": "Exists", "key": "gpu-stack.io/mps"}], {}, [],
                 id="equal-reordered"),
    # a broader toleration (Exists, no key) tolerates every taint: nothing
    pytest.param([{"operator": "Exists"}], {}, [], id="tolerate-everything"),
    # Exists on the key with any effect: nothing
    pytest.param([{"key": "gpu-stack.io/mps", "operator": "Exists"}], {}, [], id="exists-key-any-effect"),
    # Exists on the key but only NoExecute: NoSchedule still missing -> append
    pytest.param([{"key": "gpu-stack.io/mps", "operator": "Exists", "effect": "NoExecute"}], {}, [APPEND_TOL],
                 id="exists-key-other-effect"),
    # Exists with no key but only NoExecute: append
    pytest.param([{"operator": "Exists", "effect": "NoExecute"}], {}, [APPEND_TOL], id="exists-all-noexecute"),
    # Equal with a value: tolerates only that value of the taint -> append the Exists one
    pytest.param([{"key": "gpu-stack.io/mps", "operator": "Equal", "value": "x", "effect": "NoSchedule"}], {},
                 [APPEND_TOL], id="equal-value-narrower"),
    # another key's toleration: append
    pytest.param([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], {}, [APPEND_TOL],
                 id="other-key"),
    # two configured tolerations, one present: only the missing one is appended
    pytest.param([dict(TOL)], {"tolerations": [TOL, {"key": "mps-b", "operator": "Exists", "effect": "NoExecute"}]},
                 [{"op": "add", "path": "/spec/tolerations/-",
                   "value": {"key": "mps-b", "operator": "Exists", "effect": "NoExecute"}}],
                 id="two-configured-one-missing"),
    # a configured Equal toleration with a value, absent: added as configured
    pytest.param("absent",
                 {"tolerations": [{"key": "mps", "operator": "Equal", "value": "on", "effect": "NoSchedule"}]},
                 [{"op": "add", "path": "/spec/tolerations",
                   "value": [{"key": "mps", "operator": "Equal", "value": "on", "effect": "NoSchedule"}]}],
                 id="configured-equal-absent"),
    # no configured tolerations: nothing to add
    pytest.param("absent", {"tolerations": []}, [], id="no-configured-tolerations"),
    # an Equal toleration with the same key/value and no effect tolerates every effect -> nothing to add
    pytest.param([{"key": "mps", "operator": "Equal", "value": "on"}],
                 {"tolerations": [{"key": "mps", "operator": "Equal", "value": "on", "effect": "NoSchedule"}]}, [],
                 id="equal-no-effect-is-broader"),
]


@pytest.mark.parametrize(("tolerations", "mps", "expected"), TOLERATIONS)
def test_only_missing_tolerations_are_added(tolerations: Any, mps: dict[str, Any],
                                            expected: list[dict[str, Any]]) -> None:
    spec: dict[str, Any] = {} if tolerations == "absent" else {"tolerations": tolerations}
    pod = gpu_pod(nodeSelector={MPS_LABEL: "true"}, **spec)
    config = config_default(mps={"injectHostIPC": False, **mps})
    found = findings(pod, RULE, config=config, can_patch=True)
    patched = apply_patch(pod, expected)
    assert changes(pod, config) == patched
    if expected:
        f = only(found)
        assert f.path == "spec.tolerations" and f.message.startswith("added MPS toleration ")
    else:
        assert found == [] and rule_patch(pod, RULE, config) == []
    assert rule_patch(patched, RULE, config) == []


@pytest.mark.parametrize(
    ("host_ipc", "inject", "expected"),
    [
        # hostIPC absent: add true
        pytest.param("absent", True, [HOST_IPC], id="absent-added"),
        # hostIPC false: set to true (add replaces the member)
        pytest.param(False, True, [HOST_IPC], id="false-set-true"),
        # already true: nothing
        pytest.param(True, True, [], id="true-unchanged"),
        # injectHostIPC false (Pod Security baseline namespaces): never added
        pytest.param("absent", False, [], id="inject-off"),
        pytest.param(False, False, [], id="inject-off-false-kept"),
    ],
)
def test_host_ipc_injection(host_ipc: Any, inject: bool, expected: list[dict[str, Any]]) -> None:
    spec = {} if host_ipc == "absent" else {"hostIPC": host_ipc}
    pod = gpu_pod(tolerations=[dict(TOL)], **spec)
    config = config_mps(mps={"injectHostIPC": inject})
    found = findings(pod, RULE, config=config, can_patch=True)
    assert changes(pod, config) == apply_patch(pod, expected)
    assert (rule_patch(pod, RULE, config) == []) is (expected == [])
    if expected:
        f = only(found)
        assert f.path == "spec.hostIPC"
        # says what, why, and how to turn it off
        assert "hostIPC=true" in f.message and "(nvidia.com/gpu is MPS-shared)" in f.message
        assert "mps.injectHostIPC" in f.message


# (nodeSelector of the pod, mps.nodeSelector config, expected selector ops, denied)
SELECTORS = [
    # no nodeSelector: add it whole
    pytest.param("absent", None, [ADD_SELECTOR], False, id="absent-add-map"),
    # an unrelated nodeSelector: add the key, pointer-escaped
    pytest.param({"zone": "a"}, None,
                 [{"op": "add", "path": "/spec/nodeSelector/nvidia.com~1mps.capable", "value": "true"}], False,
                 id="other-keys-add-key"),
    # the MPS label already selected: nothing
    pytest.param({MPS_LABEL: "true"}, None, [], False, id="already-selected"),
    # the MPS label with another value: opt-in contradicts the selector -> deny, already at /mutate
    pytest.param({MPS_LABEL: "false"}, None, [], True, id="conflicting-value-denied"),
    # two configured labels, one present: add only the other
    pytest.param({MPS_LABEL: "true"}, {MPS_LABEL: "true", "example.com/mps": "on"},
                 [{"op": "add", "path": "/spec/nodeSelector/example.com~1mps", "value": "on"}], False,
                 id="two-configured-one-missing"),
]


@pytest.mark.parametrize(("selector", "configured", "expected", "denied"), SELECTORS)
def test_annotation_opt_in_node_selector(selector: Any, configured: Any, expected: list[dict[str, Any]],
                                         denied: bool) -> None:
    spec = {} if selector == "absent" else {"nodeSelector": selector}
    pod = gpu_pod(annotations={ANNOTATION: "true"}, tolerations=[dict(TOL)], hostIPC=True, **spec)
    mps: dict[str, Any] = {} if configured is None else {"nodeSelector": configured}
    config = config_default(mps=mps)
    found = findings(pod, RULE, config=config, can_patch=True)
    assert changes(pod, config) == apply_patch(pod, expected)
    assert (rule_patch(pod, RULE, config) == []) is (expected == [])
    if denied:
        f = only(found)
        assert f.severity is Severity.DENY and f.deny_early and f.path == "spec.nodeSelector"
        assert f'nodeSelector {MPS_LABEL}="false" excludes MPS nodes' in f.message
        decision = decide(pod, "mutate", config)
        assert not decision.allowed and decision.code == 403 and decision.message.startswith("GPU006 opts in to MPS")
    else:
        assert all(f.severity is Severity.WARN for f in found)
        assert decide(pod, "mutate", config).allowed


@pytest.mark.parametrize("kind", WORKLOAD_KINDS)
def test_workload_templates_get_a_warning_not_a_patch(kind: str) -> None:
    # an MPS Deployment/Job/...: /validate warns that each pod will be mutated; /mutate sends no patch
    obj = wrap(gpu_pod(), kind)
    f = only(findings(obj, RULE, kind, MPS))
    assert (f.severity, f.path, f.changed) == (Severity.WARN, SPEC_PATH[kind], False)
    assert f.message == "MPS pods (nvidia.com/gpu is MPS-shared): hostIPC/tolerations get added per pod"
    decision = decide(obj, "mutate", MPS, kind=kind)
    assert decision.allowed and decision.patch == () and decision.warnings == ()
    validated = decide(obj, "validate", MPS, kind=kind)
    assert validated.allowed and validated.warnings == (f"gpu-stack GPU006: {f.message}",)


def test_created_pod_is_not_warned_again_at_validate() -> None:
    # the Pod was already mutated; /validate of a Pod says nothing about MPS
    pod = gpu_pod()
    assert findings(pod, RULE, config=MPS) == []
    assert decide(pod, "validate", MPS).warnings == ()


def test_mutate_response_for_mps_pod() -> None:
    # Pod CREATE at /mutate: allowed, both ops, a warning per change, audited
    pod = gpu_pod(tolerations=list(DEFAULT_TOLS))
    decision = decide(pod, "mutate", MPS)
    assert decision.allowed
    assert apply_patch(pod, decision.patch) == apply_patch(pod, [HOST_IPC, APPEND_TOL])
    assert len(decision.warnings) == 2
    hostipc, toleration = decision.warnings
    assert hostipc.startswith("gpu-stack GPU006: ") and "hostIPC=true" in hostipc
    assert toleration == "gpu-stack GPU006: added MPS toleration gpu-stack.io/mps (nvidia.com/gpu is MPS-shared)"
    assert dict(decision.audit) == {"mutations": "GPU006"}


@pytest.mark.parametrize("kind", ["Deployment"])
def test_conflicting_opt_in_in_template_is_denied(kind: str) -> None:
    # workload template: annotation opt-in + nodeSelector mps.capable=false -> every pod would be denied -> deny
    obj = wrap(gpu_pod(annotations={ANNOTATION: "true"}, nodeSelector={MPS_LABEL: "false"}), kind)
    decision = decide(obj, "validate", DEFAULT, kind=kind)
    assert not decision.allowed
    assert "GPU006" in decision.message and f"{SPEC_PATH[kind]}.nodeSelector" in decision.message


def test_disabled_rule_reports_nothing() -> None:
    # GPU006 disabled: an MPS pod is not mutated
    config = config_mps(rules={"disabled": ["GPU006"]})
    assert findings(gpu_pod(), RULE, config=config, can_patch=True) == []
    decision = decide(gpu_pod(), "mutate", config)
    assert decision.allowed and decision.patch == ()


def test_mps_pod_requesting_two_is_denied_by_gpu004_not_gpu006() -> None:
    # MPS pod with 2 replicas: GPU006 still patches at /mutate (allowed there), GPU004 denies at /validate
    pod = make_pod([container("cuda", gpu=2)])
    assert decide(pod, "mutate", MPS).allowed
    decision = decide(pod, "validate", MPS)
    assert not decision.allowed and decision.message.startswith("GPU004 ")
    assert GPU in decision.message
