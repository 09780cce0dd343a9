"""Endpoint semantics of Policy.review: what /mutate and /validate answer for each kind of request."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from gpu_stack_webhook.admission import decide as admission_decide
from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.admission.review import parse_review
from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.policy.rules import RULE_IDS, RULES, Rule

from .podlib import (
    ALL_KINDS,
    GPU,
    SPEC_PATH,
    WORKLOAD_KINDS,
    apply_patch,
    container,
    make_pod,
    pod_spec_of,
    review,
    wrap,
)
from .policylib import config_default, config_mps, decide

VISIBLE = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
DEVICES = "/var/run/nvidia-container-devices/all"


def bad_pod(**kw: Any) -> dict[str, Any]:
    """A GPU pod /validate denies (GPU002) but Kubernetes itself accepts."""
    return make_pod([container("cuda", gpu=1, env=[VISIBLE])], **kw)


# --- mutate vs validate ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_validate_only_violation_passes_mutate_and_fails_validate(kind: str) -> None:
    # NVIDIA_VISIBLE_DEVICES: Kubernetes would accept it, so /mutate allows it and leaves it to /validate
    obj = wrap(bad_pod(), kind)
    mutated = decide(obj, "mutate", kind=kind)
    assert mutated.allowed and mutated.patch == ()
    validated = decide(obj, "validate", kind=kind)
    assert not validated.allowed and validated.code == 403
    assert validated.message.startswith('GPU002 container "cuda" sets NVIDIA_VISIBLE_DEVICES')
    assert validated.message.endswith(f"({SPEC_PATH[kind]}.containers[0].env[0])")
    assert validated.rules == ("GPU002",)
    assert dict(validated.audit) == {"denied-by": "GPU002"}


def test_clean_gpu_pod_is_allowed_silently_at_both_endpoints() -> None:
    # a well-formed GPU pod: allowed, no patch, no warning, no audit annotation
    pod = make_pod([container("cuda", gpu=1)])
    for endpoint in ("mutate", "validate"):
        decision = decide(pod, endpoint)
        assert (decision.allowed, decision.patch, decision.warnings, dict(decision.audit)) == (True, (), (), {})


def test_one_denial_lists_every_violation() -> None:
    # three rules broken in three containers: one 403 that names all of them, numbered, with their paths
    pod = make_pod(
        [container("a", gpu=1, env=[VISIBLE]), container("b", privileged=True), container("c", mounts=[DEVICES])]
    )
    decision = decide(pod, "validate")
    assert not decision.allowed and decision.code == 403
    assert decision.message.startswith("3 GPU policy violations: [1] GPU002 container \"a\"")
    assert "(spec.containers[0].env[0]); [2] GPU003 container \"b\"" in decision.message
    assert "(spec.containers[1].securityContext.privileged); [3] GPU007 container \"c\"" in decision.message
    assert decision.message.endswith("(spec.containers[2].volumeMounts[0])")
    assert decision.rules == ("GPU002", "GPU003", "GPU007")
    assert dict(decision.audit) == {"denied-by": "GPU002,GPU003,GPU007"}


def test_denial_also_carries_the_warnings() -> None:
    # a denied pod that also has a warning-level finding: the user sees both
    pod = make_pod([container("cuda", gpu=1, env=[VISIBLE], env_from=[{"configMapRef": {"name": "cm"}}])])
    decision = decide(pod, "validate")
    assert not decision.allowed
    assert decision.warnings == (
        'gpu-stack GPU002: container "cuda": envFrom ConfigMap "cm" has no prefix; it must not hold '
        "NVIDIA_VISIBLE_DEVICES",
    )
    assert decision.rules == ("GPU002",)


def test_deny_early_at_mutate_lists_all_violations() -> None:
    # GPU001 mismatch (Kubernetes rejects it after /mutate): /mutate already denies, listing the GPU002 too
    pod = make_pod([container("cuda", requests={GPU: 1}, limits={GPU: 2}, env=[VISIBLE])])
    decision = decide(pod, "mutate")
    assert not decision.allowed and decision.code == 403
    assert decision.message.startswith("2 GPU policy violations: [1] GPU001 container \"cuda\": nvidia.com/gpu "
                                       "request 1 != limit 2")
    assert "[2] GPU002 container \"cuda\" sets NVIDIA_VISIBLE_DEVICES" in decision.message
    assert decision.patch == ()


def test_deny_early_drops_the_patches() -> None:
    # an MPS pod (would be patched) that is also denied early: no patch in a denial
    pod = make_pod([container("a", gpu=1), container("b", requests={GPU: "500m"}, limits={GPU: "500m"})])
    decision = decide(pod, "mutate", config_mps())
    assert not decision.allowed and decision.patch == ()
    assert decision.message.startswith("GPU001 container \"b\"")


def test_only_validate_sees_non_early_denials_next_to_patches() -> None:
    # request-only GPU + NVIDIA_VISIBLE_DEVICES: /mutate fills the limit (allowed), /validate of the result denies
    pod = make_pod([container("cuda", requests={GPU: 1}, env=[VISIBLE])])
    mutated = decide(pod, "mutate")
    assert mutated.allowed
    assert list(mutated.patch) == [{"op": "add", "path": "/spec/containers/0/resources/limits", "value": {GPU: 1}}]
    assert mutated.rules == ("GPU001",) and dict(mutated.audit) == {"mutations": "GPU001"}
    validated = decide(apply_patch(pod, mutated.patch), "validate")
    assert not validated.allowed and validated.rules == ("GPU002",)


# --- UPDATE -----------------------------------------------------------------------------------------


def test_unchanged_violation_is_not_denied_on_label_update() -> None:
    # a pod admitted before the policy existed gets a new label: the old violation is not the user's change
    old = bad_pod()
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"team": "ml"}
    decision = decide(new, "validate", operation="UPDATE", old=old)
    assert decision.allowed and decision.message == ""


def test_update_at_mutate_is_never_patched() -> None:
    # UPDATE through /mutate: allowed untouched, even when a CREATE would be patched
    old = make_pod([container("cuda", gpu=1)])
    new = make_pod([container("cuda", requests={GPU: 1})])
    decision = decide(new, "mutate", config_mps(), operation="UPDATE", old=old)
    assert decision.allowed and decision.patch == () and decision.skipped == "UPDATE is not mutated"


@pytest.mark.parametrize(
    ("ephemeral", "gpu_pod", "denied", "rule"),
    [
        # kubectl debug with NVIDIA_VISIBLE_DEVICES=all in the debug container: a new violation -> deny
        pytest.param(container("dbg", env=[VISIBLE]), True, True, "GPU002", id="visible-devices-debug"),
        # ... also in a non-GPU pod
        pytest.param(container("dbg", env=[VISIBLE]), False, True, "GPU002", id="visible-devices-debug-non-gpu"),
        # kubectl debug --profile=sysadmin (privileged) into a GPU pod -> deny
        pytest.param(container("dbg", privileged=True), True, True, "GPU003", id="privileged-debug-gpu-pod"),
        # privileged debug container in a non-GPU pod: no GPU to reach -> allowed
        pytest.param(container("dbg", privileged=True), False, False, None, id="privileged-debug-non-gpu-pod"),
        # a device-list mount in the debug container -> deny
        pytest.param(container("dbg", mounts=[DEVICES]), True, True, "GPU007", id="device-mount-debug"),
        # an ordinary debug container -> allowed
        pytest.param(container("dbg", image="busybox:1.36"), True, False, None, id="plain-debug"),
    ],
)
def test_new_ephemeral_container(ephemeral: dict[str, Any], gpu_pod: bool, denied: bool, rule: str | None) -> None:
    old = make_pod([container("main", gpu=1 if gpu_pod else None)])
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [ephemeral]
    decision = decide(new, "validate", operation="UPDATE", old=old, sub_resource="ephemeralcontainers")
    assert decision.allowed is not denied
    if denied:
        assert decision.message.startswith(f'{rule} ephemeralContainer "dbg"')
        assert "(spec.ephemeralContainers[0]." in decision.message
    # /mutate never patches or denies an UPDATE
    assert decide(new, "mutate", operation="UPDATE", old=old, sub_resource="ephemeralcontainers").allowed


def test_second_ephemeral_container_judged_even_when_first_was_grandfathered() -> None:
    # the first debug container predates the policy; a second, identical one is new -> deny at index 1
    old = make_pod([container("main", gpu=1)], ephemeral=[container("dbg1", env=[VISIBLE])])
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"].append(container("dbg2", env=[VISIBLE]))
    decision = decide(new, "validate", operation="UPDATE", old=old, sub_resource="ephemeralcontainers")
    assert not decision.allowed
    assert decision.message.startswith('GPU002 ephemeralContainer "dbg2"')
    assert "dbg1" not in decision.message


@pytest.mark.parametrize("kind", WORKLOAD_KINDS)
def test_workload_update_introducing_a_violation_is_denied(kind: str) -> None:
    # kubectl set env deployment/x NVIDIA_VISIBLE_DEVICES=all -> deny
    old = wrap(make_pod([container("cuda", gpu=1)]), kind)
    new = copy.deepcopy(old)
    pod_spec_of(new, kind)["containers"][0]["env"] = [VISIBLE]
    decision = decide(new, "validate", kind=kind, operation="UPDATE", old=old)
    assert not decision.allowed and decision.code == 403
    assert decision.message.endswith(f"({SPEC_PATH[kind]}.containers[0].env[0])")


@pytest.mark.parametrize("kind", WORKLOAD_KINDS)
def test_workload_update_keeping_an_old_violation_is_allowed(kind: str) -> None:
    # a grandfathered bad workload scaled or relabelled: its old violation is not re-judged
    old = wrap(bad_pod(), kind)
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"scaled": "yes"}
    assert decide(new, "validate", kind=kind, operation="UPDATE", old=old).allowed


def test_cronjob_suspend_of_bad_cronjob_is_allowed() -> None:
    # kubectl patch cronjob -p '{"spec":{"suspend":true}}' on a CronJob with a privileged GPU template -> allowed
    old = wrap(make_pod([container("cuda", gpu=1, privileged=True)]), "CronJob")
    new = copy.deepcopy(old)
    new["spec"]["suspend"] = True
    assert not decide(old, "validate", kind="CronJob").allowed  # it would not be admitted today
    decision = decide(new, "validate", kind="CronJob", operation="UPDATE", old=old)
    assert decision.allowed and decision.warnings == ()


def test_update_without_old_object_is_judged_fully() -> None:
    # an UPDATE missing oldObject cannot be diffed: every finding counts
    decision = decide(bad_pod(), "validate", operation="UPDATE", old=None)
    assert not decision.allowed and decision.rules == ("GPU002",)


def test_update_whose_old_object_has_no_pod_spec_is_judged_fully() -> None:
    # oldObject unreadable as a pod: the new object's findings all count
    decision = decide(bad_pod(), "validate", operation="UPDATE", old={"kind": "Pod", "metadata": {"name": "x"}})
    assert not decision.allowed


# --- requests that are not judged ------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
@pytest.mark.parametrize("operation", ["DELETE", "CONNECT"])
def test_delete_and_connect_are_allowed(endpoint: str, operation: str) -> None:
    # deleting (object null, oldObject set) or exec-ing into a bad pod is always allowed
    decision = decide(None, endpoint, operation=operation, old=bad_pod(), kind="Pod")
    assert decision.allowed and decision.patch == () and decision.skipped == f"operation {operation}"


@pytest.mark.parametrize("namespace", ["gpu-stack", "kube-system"])
@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_default_exempt_namespaces(namespace: str, endpoint: str) -> None:
    # the chart's own namespace and kube-system are never judged nor patched
    pod = make_pod([container("cuda", requests={GPU: 1}, env=[VISIBLE], privileged=True)], namespace=namespace)
    decision = decide(pod, endpoint)
    assert decision.allowed and decision.patch == ()
    assert decision.skipped == f"namespace {namespace} is exempt"


def test_configured_exempt_namespaces_replace_the_defaults() -> None:
    # exemptNamespaces [ml-infra]: ml-infra is skipped, both defaults (gpu-stack, kube-system) are judged again
    config = config_default(exemptNamespaces=["ml-infra"])
    assert decide(bad_pod(namespace="ml-infra"), "validate", config).allowed
    for default_exempt in PolicyConfig().exempt_namespaces:
        assert not decide(bad_pod(namespace=default_exempt), "validate", config).allowed, default_exempt


@pytest.mark.parametrize(
    ("group", "kind"),
    [
        # a ConfigMap holding pod-like data -> not judged
        pytest.param("", "ConfigMap", id="configmap"),
        # a custom resource that happens to have a pod template -> not judged
        pytest.param("example.com", "Notebook", id="crd"),
        # the right kind name in the wrong group -> not judged
        pytest.param("example.com", "Deployment", id="deployment-wrong-group"),
        pytest.param("apps", "Pod", id="pod-wrong-group"),
    ],
)
def test_non_pod_kinds_are_skipped(group: str, kind: str) -> None:
    obj = wrap(bad_pod(), "Deployment") | {"kind": kind}
    for endpoint in ("mutate", "validate"):
        decision = decide(obj, endpoint, kind=kind, group=group)
        assert decision.allowed and decision.skipped == f"kind {group or 'core'}/{kind}"


@pytest.mark.parametrize("sub_resource", ["status", "binding", "eviction"])
def test_other_subresources_are_skipped(sub_resource: str) -> None:
    # a status update of a grandfathered bad pod is not judged
    decision = decide(bad_pod(), "validate", operation="UPDATE", old=bad_pod(), sub_resource=sub_resource)
    assert decision.allowed and decision.skipped == f"subresource {sub_resource}"


@pytest.mark.parametrize(
    ("kind", "obj"),
    [
        # a Pod without spec
        pytest.param("Pod", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}, id="pod-no-spec"),
        # a Pod whose containers is not a list
        pytest.param("Pod", {"kind": "Pod", "spec": {"containers": {"name": "x"}}}, id="pod-containers-map"),
        # a Deployment without a template
        pytest.param("Deployment", {"kind": "Deployment", "spec": {"replicas": 1}}, id="deployment-no-template"),
        # a CronJob with the template at the Job's place (not under jobTemplate)
        pytest.param("CronJob", {"kind": "CronJob", "spec": {"template": {"spec": {"containers": []}}}},
                     id="cronjob-misplaced-template"),
        # spec is a list
        pytest.param("Job", {"kind": "Job", "spec": []}, id="job-spec-list"),
    ],
)
@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_object_without_pod_spec_is_a_400(kind: str, obj: dict[str, Any], endpoint: str) -> None:
    decision = decide(obj, endpoint, kind=kind)
    assert not decision.allowed and decision.code == 400
    assert decision.message.startswith(f"gpu-stack: {kind} ")


def test_dry_run_is_judged_like_a_real_request() -> None:
    # kubectl --dry-run=server must show the same denial
    assert not decide(bad_pod(), "validate", dry_run=True).allowed


# --- a rule that crashes ---------------------------------------------------------------------------


def _boom(pod: Any, ctx: Any) -> Any:
    raise KeyError("unexpected shape")


CRASHING = Rule(id="GPU999", name="crashes", summary="always raises", check=_boom)


def test_crashing_rule_fails_closed_at_validate() -> None:
    # a bug in a rule must not let pods through /validate: 500, naming the rule
    policy = Policy(config_default(), rules=(*RULES, CRASHING))
    request = parse_review(review(make_pod([container("cuda", gpu=1)])))
    decision = admission_decide.review(policy, request, Endpoint.VALIDATE)
    assert not decision.allowed and decision.code == 500
    assert "GPU999" in decision.message and "KeyError" in decision.message
    assert decision.rules == ("GPU999",) and dict(decision.audit) == {"internal-error": "GPU999"}


def test_crashing_rule_does_not_block_mutate() -> None:
    # /mutate allows unpatched with a warning; /validate is where the decision is made
    policy = Policy(config_default(), rules=(CRASHING,))
    request = parse_review(review(make_pod([container("cuda", requests={GPU: 1})])))
    decision = admission_decide.review(policy, request, Endpoint.MUTATE)
    assert decision.allowed and decision.patch == ()
    assert decision.warnings == ("gpu-stack: internal error in rule GPU999; the pod was not mutated",)


def test_crashing_rule_on_a_disabled_list_never_runs() -> None:
    # a disabled rule is not even called: a crashing rule under a disabled ID leaves no trace in the answer
    crashing_gpu003 = Rule(id="GPU003", name="crashes", summary="always raises", check=_boom)
    policy = Policy(config_default(rules={"disabled": ["GPU003"]}), rules=(*RULES, crashing_gpu003))
    assert crashing_gpu003 not in policy.rules
    decision = admission_decide.review(policy, parse_review(review(bad_pod())), Endpoint.VALIDATE)
    assert not decision.allowed and decision.code == 403 and decision.rules == ("GPU002",)
    assert "internal-error" not in decision.audit


def test_disabling_every_rule_allows_what_they_would_deny() -> None:
    policy = Policy(config_default(rules={"disabled": sorted(RULE_IDS)}))
    assert policy.rules == ()
    assert admission_decide.review(policy, parse_review(review(bad_pod())), Endpoint.VALIDATE).allowed


# --- idempotency -------------------------------------------------------------------------------------

IDEMPOTENT = [
    # request-only GPU: the limit is filled once
    pytest.param(make_pod([container("cuda", requests={GPU: 1})]), config_default(), id="gpu001-fill"),
    # request-only in init and main containers, limits map present in one
    pytest.param(make_pod([container("a", requests={GPU: 1, "cpu": "1"}, limits={"cpu": "1"})],
                          init=[container("i", requests={GPU: "1000m"})]), config_default(), id="gpu001-two"),
    # MPS pod by resource, tolerations absent
    pytest.param(make_pod([container("cuda", gpu=1)]), config_mps(), id="mps-resource"),
    # MPS by annotation: hostIPC, tolerations and nodeSelector
    pytest.param(make_pod([container("cuda", gpu=1)], annotations={"gpu-stack.io/mps": "true"},
                          nodeSelector={"zone": "a"}), config_default(), id="mps-annotation"),
    # both at once: limit fill and MPS injection
    pytest.param(make_pod([container("cuda", requests={GPU: 1})], tolerations=[]), config_mps(), id="both"),
]


@pytest.mark.parametrize(("pod", "config"), IDEMPOTENT)
def test_mutating_the_mutated_pod_yields_no_patch(pod: dict[str, Any], config: Any) -> None:
    # reinvocationPolicy IfNeeded: the webhook called again on its own output must change nothing
    first = decide(pod, "mutate", config)
    assert first.allowed and first.patch, "the case must need a patch the first time"
    mutated = apply_patch(pod, first.patch)
    second = decide(mutated, "mutate", config)
    assert second.allowed and second.patch == () and second.warnings == ()
    # and what /validate then sees of it is clean
    assert decide(mutated, "validate", config).allowed
