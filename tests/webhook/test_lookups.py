"""Cluster lookups in the policy (facts.py through the rules' Context): envFrom ConfigMaps (GPU002) and
the namespace's Pod Security level for MPS pods (GPU006); the TTL cache; the offline fallback."""

from __future__ import annotations

from typing import Any

import pytest
from gpu_stack_webhook.admission import decide as admission_decide
from gpu_stack_webhook.admission.decide import Decision, Endpoint
from gpu_stack_webhook.admission.pipeline import response_of
from gpu_stack_webhook.admission.review import MAX_WARNING_CHARS, parse_review
from gpu_stack_webhook.kube.lookups import ApiFacts
from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.policy.facts import OFFLINE, ClusterFacts

from .kube_fake import FakeKube
from .podlib import GPU, apply_patch, container, make_pod, review, wrap
from .policylib import config_default, config_mps

NS = "team-a"
CM = "app-env"
MPS = {"gpu-stack.io/mps": "true"}


def facts_for(fake: FakeKube, **kw: Any) -> ApiFacts:
    return ApiFacts(fake, **kw)


def decide(obj: dict[str, Any], endpoint: str, facts: ClusterFacts, config: PolicyConfig | None = None,
           kind: str = "Pod") -> Decision:
    policy = Policy(config or config_default(), facts=facts)
    request = parse_review(review(obj, kind=kind, namespace=NS))
    return admission_decide.review(policy, request, Endpoint(endpoint))


def env_from_pod(ref: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return make_pod([container("main", gpu=1, env_from=[ref])], namespace=NS, **kw)


def fake_with(keys: set[str] | None = None, enforce: str | None = None) -> FakeKube:
    fake = FakeKube()
    if keys is not None:
        fake.configmaps[(NS, CM)] = frozenset(keys)
    fake.namespaces[NS] = {"pod-security.kubernetes.io/enforce": enforce} if enforce else {}
    return fake


def gpu002(decision: Decision) -> list[str]:
    return [w for w in decision.warnings if "GPU002" in w]


# --- GPU002: envFrom ConfigMaps ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["Pod", "Deployment", "CronJob"])
def test_an_envfrom_configmap_holding_the_key_is_denied(kind: str) -> None:
    fake = fake_with({"LOG_LEVEL", "NVIDIA_VISIBLE_DEVICES"})
    decision = decide(wrap(env_from_pod({"configMapRef": {"name": CM}}), kind), "validate", facts_for(fake), kind=kind)
    assert not decision.allowed and decision.code == 403
    assert decision.message.startswith(f'GPU002 container "main" imports ConfigMap "{CM}" (envFrom, no prefix), '
                                       "which holds NVIDIA_VISIBLE_DEVICES")
    assert "remove that key or set an envFrom prefix" in decision.message
    assert fake.calls == [("read_configmap", (NS, CM))]


def test_an_envfrom_configmap_without_the_key_is_neither_denied_nor_warned() -> None:
    fake = fake_with({"LOG_LEVEL"})
    decision = decide(env_from_pod({"configMapRef": {"name": CM}}), "validate", facts_for(fake))
    assert decision.allowed and gpu002(decision) == []


def test_offline_the_same_pod_keeps_the_warning() -> None:
    decision = decide(env_from_pod({"configMapRef": {"name": CM}}), "validate", OFFLINE)
    assert decision.allowed
    assert gpu002(decision) == [f'gpu-stack GPU002: container "main": envFrom ConfigMap "{CM}" has no prefix; it '
                                "must not hold NVIDIA_VISIBLE_DEVICES"]


def test_a_configmap_that_does_not_exist_yet_keeps_a_warning() -> None:
    decision = decide(env_from_pod({"configMapRef": {"name": CM}}), "validate", facts_for(fake_with(None)))
    assert decision.allowed
    assert gpu002(decision) == [f'gpu-stack GPU002: container "main": envFrom ConfigMap "{CM}" must not hold '
                                "NVIDIA_VISIBLE_DEVICES (not found yet)"]


def test_secrets_are_never_read_and_keep_the_warning() -> None:
    fake = fake_with({"NVIDIA_VISIBLE_DEVICES"})
    decision = decide(env_from_pod({"secretRef": {"name": CM}}), "validate", facts_for(fake))
    assert decision.allowed
    assert gpu002(decision) == [f'gpu-stack GPU002: container "main": envFrom Secret "{CM}" has no prefix; it must '
                                "not hold NVIDIA_VISIBLE_DEVICES"]
    assert fake.calls == []


def test_a_dangerous_prefix_is_denied_without_asking() -> None:
    fake = fake_with({"VISIBLE_DEVICES"})
    decision = decide(env_from_pod({"configMapRef": {"name": CM}, "prefix": "NVIDIA_"}), "validate", facts_for(fake))
    assert not decision.allowed and 'with prefix "NVIDIA_"' in decision.message
    assert fake.calls == []


def test_an_unreachable_api_falls_back_to_the_offline_warning_and_says_so() -> None:
    fake = fake_with({"NVIDIA_VISIBLE_DEVICES"})
    fake.unreachable = True
    decision = decide(env_from_pod({"configMapRef": {"name": CM}}), "validate", facts_for(fake))
    assert decision.allowed
    assert gpu002(decision) == [f'gpu-stack GPU002: container "main": envFrom ConfigMap "{CM}" must not hold '
                                "NVIDIA_VISIBLE_DEVICES (API unreachable)"]


def test_missing_permission_is_a_fallback_too() -> None:
    from gpu_stack_webhook.kube.client import Forbidden  # noqa: PLC0415

    fake = fake_with({"NVIDIA_VISIBLE_DEVICES"})
    fake.fail_next["read_configmap"] = [Forbidden(403, "Forbidden", "cannot get resource configmaps")]
    decision = decide(env_from_pod({"configMapRef": {"name": CM}}), "validate", facts_for(fake))
    assert decision.allowed and "(no permission to read ConfigMaps)" in gpu002(decision)[0]


def test_answers_are_cached_for_the_ttl() -> None:
    now = [1000.0]
    fake = fake_with({"LOG_LEVEL"})
    facts = facts_for(fake, ttl=30, clock=lambda: now[0])
    pod = env_from_pod({"configMapRef": {"name": CM}})
    for _ in range(5):
        decide(pod, "validate", facts)
    assert fake.count("read_configmap") == 1
    fake.configmaps[(NS, CM)] = frozenset({"NVIDIA_VISIBLE_DEVICES"})
    now[0] += 31
    assert not decide(pod, "validate", facts).allowed  # seen after the TTL
    assert fake.count("read_configmap") == 2


def test_failures_are_cached_briefly_so_an_unreachable_api_is_not_asked_per_request() -> None:
    now = [1000.0]
    fake = fake_with({"LOG_LEVEL"})
    fake.unreachable = True
    facts = facts_for(fake, ttl=30, error_ttl=5, clock=lambda: now[0])
    pod = env_from_pod({"configMapRef": {"name": CM}})
    for _ in range(3):
        decide(pod, "validate", facts)
    assert fake.count("read_configmap") == 1
    fake.unreachable = False
    now[0] += 6
    assert gpu002(decide(pod, "validate", facts)) == []
    assert fake.count("read_configmap") == 2


def test_update_denies_only_what_is_new() -> None:
    fake = fake_with({"NVIDIA_VISIBLE_DEVICES"})
    pod = env_from_pod({"configMapRef": {"name": CM}})
    body = review(pod, kind="Pod", namespace=NS, operation="UPDATE", old=pod)
    policy = Policy(config_default(), facts=facts_for(fake))
    decision = admission_decide.review(policy, parse_review(body), Endpoint.VALIDATE)
    assert decision.allowed  # the pod already imported it when it was created


# --- GPU006: MPS pods and Pod Security ---------------------------------------------------------------------


def mps_pod() -> dict[str, Any]:
    return make_pod([container("cuda", gpu=1)], namespace=NS, annotations=MPS)


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_an_mps_pod_where_pod_security_forbids_hostipc_is_denied_with_the_way_out(level: str) -> None:
    decision = decide(mps_pod(), "mutate", facts_for(fake_with(enforce=level)), config_mps())
    assert not decision.allowed and decision.code == 403
    message = decision.message
    assert message.startswith("GPU006 MPS pods (annotation gpu-stack.io/mps) get hostIPC, which Pod Security "
                              f'"{level}" enforced in namespace {NS} forbids, so the pod would be rejected')
    assert "label the namespace pod-security.kubernetes.io/enforce=privileged" in message
    assert "mps.injectHostIPC=false (NVIDIA MPS does not need hostIPC)" in message
    assert decision.patch == ()


def test_a_workload_whose_mps_pods_would_be_rejected_is_denied_on_validate() -> None:
    obj = wrap(mps_pod(), "Deployment")
    decision = decide(obj, "validate", facts_for(fake_with(enforce="baseline")), config_mps(), kind="Deployment")
    assert not decision.allowed and "Pod Security \"baseline\"" in decision.message


def test_skip_mode_leaves_hostipc_out_with_a_warning_and_still_adds_the_toleration() -> None:
    config = config_mps(mps={"podSecurityConflict": "skip"})
    pod = mps_pod()
    decision = decide(pod, "mutate", facts_for(fake_with(enforce="baseline")), config)
    assert decision.allowed
    patched = apply_patch(pod, decision.patch)
    assert "hostIPC" not in patched["spec"]
    assert patched["spec"]["tolerations"] == [{"key": "gpu-stack.io/mps", "operator": "Exists", "effect": "NoSchedule"}]
    skipped = 'gpu-stack GPU006: hostIPC not added for MPS: namespace enforces Pod Security "baseline"'
    assert skipped in decision.warnings


@pytest.mark.parametrize("labels", [{"pod-security.kubernetes.io/enforce": "privileged"}, {}])
def test_where_pod_security_allows_it_hostipc_is_injected(labels: dict[str, str]) -> None:
    fake = FakeKube()
    fake.namespaces[NS] = labels
    pod = mps_pod()
    decision = decide(pod, "mutate", facts_for(fake), config_mps())
    assert decision.allowed
    assert apply_patch(pod, decision.patch)["spec"]["hostIPC"] is True
    assert fake.calls == [("read_namespace", (NS,))]


def test_an_unreachable_api_injects_as_offline_and_says_pod_security_was_not_checked() -> None:
    fake = fake_with(enforce="baseline")
    fake.unreachable = True
    pod = mps_pod()
    decision = decide(pod, "mutate", facts_for(fake), config_mps())
    assert decision.allowed
    assert apply_patch(pod, decision.patch)["spec"]["hostIPC"] is True
    assert ("gpu-stack GPU006: hostIPC=true for MPS (annotation gpu-stack.io/mps); Pod Security unchecked: "
            "API unreachable") in decision.warnings


def test_no_lookup_when_hostipc_is_not_injected() -> None:
    fake = fake_with(enforce="baseline")
    decision = decide(mps_pod(), "mutate", facts_for(fake), config_mps(mps={"injectHostIPC": False}))
    assert decision.allowed and fake.calls == []


def test_non_mps_pods_cost_no_lookup() -> None:
    fake = fake_with(enforce="baseline")
    decide(make_pod([container("cuda", gpu=1)], namespace=NS), "mutate", facts_for(fake))
    assert fake.calls == []


# --- what users read ---------------------------------------------------------------------------------------


def test_new_warnings_fit_on_a_kubectl_line() -> None:
    cases = [
        decide(env_from_pod({"configMapRef": {"name": CM}}), "validate", facts_for(fake_with(None))),
        decide(mps_pod(), "mutate", facts_for(fake_with(enforce="baseline")),
               config_mps(mps={"podSecurityConflict": "skip"})),
    ]
    unreachable = fake_with(enforce="baseline")
    unreachable.unreachable = True
    cases.append(decide(env_from_pod({"configMapRef": {"name": CM}}), "validate", facts_for(unreachable)))
    cases.append(decide(mps_pod(), "mutate", facts_for(unreachable), config_mps()))
    for decision in cases:
        assert decision.warnings
        for warning in decision.warnings:
            assert len(warning) <= MAX_WARNING_CHARS, warning


def test_a_long_lookup_warning_is_cut_in_its_reason_not_in_what_it_warns_about() -> None:
    # Found against a real API server (tests/e2e/test_lookups.py): with a 9-character ConfigMap name the
    # warning ran past 120 characters and kubectl showed "... must not hold NVIDIA_VISIBLE_DEVI…".
    for name in ("later-env", "train-job-config"):
        for unreachable in (False, True):
            fake = fake_with(None)
            fake.unreachable = unreachable
            decision = decide(env_from_pod({"configMapRef": {"name": name}}), "validate", facts_for(fake))
            sent = response_of("u", decision, allow_patch=False)["response"]["warnings"]
            assert f'envFrom ConfigMap "{name}" must not hold NVIDIA_VISIBLE_DEVICES' in sent[0], sent


def test_the_gpu_resource_constant_is_what_the_pods_request() -> None:
    assert container("x", gpu=1)["resources"]["limits"] == {GPU: 1}
