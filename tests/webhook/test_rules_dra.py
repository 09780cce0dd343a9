"""GPUs from Dynamic Resource Allocation: which containers hold GPUs (a claim read through the lookups, or
deviceclass.resource.kubernetes.io/<class>), GPU002/GPU003/GPU006 on such pods, GPU009 on the claims
themselves, and the defined verdict for every claim that cannot be read."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from gpu_stack_webhook.admission import decide as admission_decide
from gpu_stack_webhook.admission.decide import Decision, Endpoint
from gpu_stack_webhook.admission.review import parse_review
from gpu_stack_webhook.kube.client import ApiUnavailable, Forbidden, KubeError
from gpu_stack_webhook.kube.lookups import ApiFacts
from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.policy.facts import OFFLINE, ClusterFacts

from .kube_fake import FakeKube
from .podlib import (
    apply_patch,
    claim_ref,
    claim_spec,
    container,
    exactly,
    gpu_config,
    make_pod,
    resource_claim,
    review,
    with_claims,
    wrap,
)
from .policylib import make_config

NS = "team-a"
DRA = "resource.k8s.io"
SYS_ADMIN = {"capabilities": {"add": ["SYS_ADMIN"]}}


def decide(obj: dict[str, Any], endpoint: str = "validate", facts: ClusterFacts = OFFLINE,
           config: PolicyConfig | None = None, kind: str | None = None, **kw: Any) -> Decision:
    kind = kind or obj["kind"]
    policy = Policy(config or make_config(), facts=facts)
    group = DRA if kind in ("ResourceClaim", "ResourceClaimTemplate") else None
    request = parse_review(review(obj, kind=kind, namespace=NS, group=group, **kw))
    return admission_decide.review(policy, request, Endpoint(endpoint))


def cluster(**claims: dict[str, Any]) -> ApiFacts:
    """ApiFacts over a fake API holding these ResourceClaims (name -> spec) and, for names ending in
    "-template", ResourceClaimTemplates."""
    fake = FakeKube()
    for name, spec in claims.items():
        template = name.endswith("-template")
        target = fake.claim_templates if template else fake.claims
        target[(NS, name)] = resource_claim(spec, name, NS, template=template)
    return ApiFacts(fake)


GPU_SPEC = claim_spec(exactly())
NIC_SPEC = claim_spec(exactly("nic", "nic.example.com"))


def pod(*containers: dict[str, Any], claims: tuple[dict[str, Any], ...] = (), **kw: Any) -> dict[str, Any]:
    return make_pod(list(containers), namespace=NS, resourceClaims=list(claims), **kw)


# --- which containers hold GPUs --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["Pod", "Deployment", "Job", "CronJob", "StatefulSet", "DaemonSet"])
def test_privileged_with_a_gpu_claim_template_is_denied_naming_the_claim(kind: str) -> None:
    obj = wrap(pod(with_claims(container("main", privileged=True), "gpu"),
                   claims=(claim_ref("gpu", template="one-gpu-template"),)), kind)
    decision = decide(obj, facts=cluster(**{"one-gpu-template": GPU_SPEC}), kind=kind)
    assert not decision.allowed and decision.denied_by == ("GPU003",)
    assert 'is privileged in a pod holding GPUs by claim "gpu" (ResourceClaimTemplate "one-gpu-template")' in \
        decision.message


def test_a_claim_for_another_device_class_is_not_a_gpu() -> None:
    obj = pod(with_claims(container("main", privileged=True), "nic"), claims=(claim_ref("nic", claim="nic"),))
    assert decide(obj, facts=cluster(nic=NIC_SPEC)).allowed


def test_first_available_counts_when_any_alternative_is_a_gpu_class() -> None:
    spec = claim_spec({"name": "any", "firstAvailable": [{"name": "nic", "deviceClassName": "nic.example.com"},
                                                         {"name": "mig", "deviceClassName": "mig.nvidia.com"}]})
    obj = pod(with_claims(container("main", privileged=True), "c"), claims=(claim_ref("c", claim="flex"),))
    decision = decide(obj, facts=cluster(flex=spec))
    assert decision.denied_by == ("GPU003",) and 'ResourceClaim "flex"' in decision.message


def test_gpu_class_list_is_policy() -> None:
    obj = pod(with_claims(container("main", privileged=True), "nic"), claims=(claim_ref("nic", claim="nic"),))
    config = make_config(dra={"gpuDeviceClasses": ["nic.example.com"]})
    assert decide(obj, facts=cluster(nic=NIC_SPEC), config=config).denied_by == ("GPU003",)


def test_a_container_naming_a_non_gpu_request_of_a_mixed_claim_holds_no_gpu() -> None:
    spec = claim_spec(exactly(), exactly("nic", "nic.example.com"))
    side = {**container("side"), "securityContext": SYS_ADMIN,
            "resources": {"claims": [{"name": "c", "request": "nic"}]}}
    own = {**container("main"), "securityContext": SYS_ADMIN,
           "resources": {"claims": [{"name": "c", "request": "gpu"}]}}
    obj = pod(own, side, claims=(claim_ref("c", claim="mixed"),))
    decision = decide(obj, facts=cluster(mixed=spec))
    assert decision.denied_by == ("GPU003",)
    assert 'container "side" adds capability SYS_ADMIN in a pod holding GPUs by claim "c"' in decision.message
    assert 'container "main"' not in decision.message  # its own GPU request


def test_sys_admin_sidecar_without_a_claim_beside_a_claimed_container_is_denied() -> None:
    obj = pod(with_claims(container("main"), "gpu"), {**container("side"), "securityContext": SYS_ADMIN},
              claims=(claim_ref("gpu", claim="gpu"),))
    decision = decide(obj, facts=cluster(gpu=GPU_SPEC))
    assert decision.denied_by == ("GPU003",) and 'container "side"' in decision.message
    alone = pod({**with_claims(container("main"), "gpu"), "securityContext": SYS_ADMIN},
                claims=(claim_ref("gpu", claim="gpu"),))
    assert decide(alone, facts=cluster(gpu=GPU_SPEC)).allowed  # its own GPU, as with the device plugin


def test_kubectl_debug_into_a_pod_with_a_gpu_claim_is_denied() -> None:
    base = pod(with_claims(container("main"), "gpu"), claims=(claim_ref("gpu", claim="gpu"),))
    new = copy.deepcopy(base)
    new["spec"]["ephemeralContainers"] = [{**container("debugger"), "securityContext": SYS_ADMIN}]
    decision = decide(new, facts=cluster(gpu=GPU_SPEC), operation="UPDATE", old=base,
                      sub_resource="ephemeralcontainers")
    assert decision.denied_by == ("GPU003",) and 'ephemeralContainer "debugger"' in decision.message


@pytest.mark.parametrize("count, allowed", [(1, False), (0, True)])
def test_deviceclass_extended_resource_of_a_gpu_class(count: int, allowed: bool) -> None:
    obj = pod(container("main", privileged=True, limits={"deviceclass.resource.kubernetes.io/gpu.nvidia.com": count}))
    decision = decide(obj)
    assert decision.allowed is allowed
    if not allowed:
        assert "deviceclass.resource.kubernetes.io/gpu.nvidia.com" in decision.message


# --- claims that cannot be read: a defined verdict, never an exception or a silent allow ------------------


def _privileged_claim_pod() -> dict[str, Any]:
    return pod(with_claims(container("main", privileged=True), "gpu"), claims=(claim_ref("gpu", claim="gpu"),))


@pytest.mark.parametrize("error, note", [
    (ApiUnavailable(0, "Unreachable", "down"), "API unreachable"),
    (Forbidden(403, "Forbidden", "no"), "no permission to read resourceclaims"),
])
def test_an_unreadable_claim_is_denied_fail_closed_saying_why(error: KubeError, note: str) -> None:
    fake = FakeKube()
    fake.fail_next["read_resource_claim"] = [error]
    decision = decide(_privileged_claim_pod(), facts=ApiFacts(fake))
    assert decision.denied_by == ("GPU003",)
    assert f'could not be read (claim "gpu" (ResourceClaim "gpu"): {note})' in decision.message


def test_a_claim_not_created_yet_is_denied_fail_closed() -> None:
    decision = decide(_privileged_claim_pod(), facts=cluster())
    assert decision.denied_by == ("GPU003",) and f"ResourceClaim {NS}/gpu not found" in decision.message


def test_offline_a_claim_is_unreadable_and_warn_mode_only_warns() -> None:
    decision = decide(_privileged_claim_pod())
    assert decision.denied_by == ("GPU003",) and "claims are not read without API lookups" in decision.message
    warned = decide(_privileged_claim_pod(), config=make_config(dra={"unresolvedClaims": "warn"}))
    assert warned.allowed and warned.warned == ("GPU003",)


def test_an_unreadable_claim_without_anything_to_deny_is_allowed_quietly() -> None:
    obj = pod(with_claims(container("main"), "gpu"), claims=(claim_ref("gpu", claim="gpu"),))
    decision = decide(obj)
    assert decision.allowed and not decision.warnings


# --- GPU002 and GPU006 ----------------------------------------------------------------------------------


def test_visible_devices_in_a_dra_pod_names_the_claim_where_the_runtime_is_not_default() -> None:
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    obj = pod(with_claims(container("main", env=env), "gpu"), claims=(claim_ref("gpu", claim="gpu"),))
    config = make_config(nvidiaRuntimeIsDefault=False)
    decision = decide(obj, facts=cluster(gpu=GPU_SPEC), config=config)
    assert decision.denied_by == ("GPU002",)
    assert "GPUs come from the pod's claim \"gpu\" (ResourceClaim \"gpu\")" in decision.message
    offline = decide(obj, config=config)
    assert offline.denied_by == ("GPU002",) and "they could not be read" in offline.message
    assert decide(pod(container("main", env=env)), config=config).allowed  # no GPU, runc


def test_mps_through_a_dra_claim_gets_no_host_ipc_and_a_warning() -> None:
    mps = claim_spec(exactly(), config=[gpu_config({"strategy": "MPS"})])
    obj = pod(with_claims(container("main"), "gpu"), claims=(claim_ref("gpu", claim="mps"),),
              annotations={"gpu-stack.io/mps": "true"})
    decision = decide(obj, "mutate", facts=cluster(mps=mps))
    assert decision.allowed and not decision.patch
    assert decision.warnings == ("gpu-stack GPU006: no hostIPC/MPS tolerations for MPS by DRA: the driver runs a "
                                 'daemon per claim and mounts its pipe and shm (annotation gpu-stack.io/mps; claim '
                                 '"gpu" (ResourceClaim "mps"))',)
    plain = pod(with_claims(container("main"), "gpu"), claims=(claim_ref("gpu", claim="gpu"),),
                annotations={"gpu-stack.io/mps": "true"})
    assert decide(plain, "mutate", facts=cluster(gpu=GPU_SPEC)).patch  # not MPS by DRA: injected as before


# --- GPU009: the claims themselves -----------------------------------------------------------------------


@pytest.mark.parametrize("template", [False, True])
def test_allocation_mode_all_is_allowed_only_in_listed_namespaces(template: bool) -> None:
    obj = resource_claim(claim_spec(exactly(allocationMode="All")), namespace=NS, template=template)
    decision = decide(obj)
    assert decision.denied_by == ("GPU009",)
    assert "allocationMode All of DeviceClass gpu.nvidia.com" in decision.message
    assert decide(obj, config=make_config(dra={"allocationModeAllNamespaces": [NS]})).allowed
    nic = resource_claim(claim_spec(exactly("nic", "nic.example.com", allocationMode="All")), namespace=NS)
    assert decide(nic).allowed


def test_admin_access_is_allowed_only_in_listed_namespaces() -> None:
    obj = resource_claim(claim_spec(exactly(adminAccess=True)), namespace=NS)
    decision = decide(obj)
    assert decision.denied_by == ("GPU009",) and "policy dra.adminAccessNamespaces" in decision.message
    assert decide(obj, config=make_config(dra={"adminAccessNamespaces": [NS]})).allowed


@pytest.mark.parametrize("strategy, gate", [("MPS", "MPSSupport"), ("TimeSlicing", "TimeSlicingSettings")])
def test_a_sharing_strategy_not_enabled_names_the_values_key(strategy: str, gate: str) -> None:
    obj = resource_claim(claim_spec(exactly(), config=[gpu_config({"strategy": strategy})]), namespace=NS)
    decision = decide(obj)
    assert decision.denied_by == ("GPU009",)
    assert f"set webhook.policy.dra.sharingStrategies to include {strategy} (the driver's feature gate {gate})" \
        in decision.message
    assert decide(obj, config=make_config(dra={"sharingStrategies": [strategy]})).allowed is True


@pytest.mark.parametrize("parameters, problem", [
    ("MPS", "parameters of driver gpu.nvidia.com are not an object"),
    ({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"}, "apiVersion is not resource.nvidia.com/v1beta1"),
    ({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "Mps"}},
     "sharing.strategy is not TimeSlicing or MPS"),
    ({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {
        "strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"}}},
     "defaultPinnedDeviceMemoryLimit is not a quantity"),
])
def test_malformed_opaque_config_is_denied_saying_what(parameters: Any, problem: str) -> None:
    config = {"opaque": {"driver": "gpu.nvidia.com", "parameters": parameters}}
    obj = resource_claim(claim_spec(exactly(), config=[config]), namespace=NS)
    decision = decide(obj, config=make_config(dra={"sharingStrategies": ["MPS"]}))
    assert decision.denied_by == ("GPU009",) and problem in decision.message


MPS_ON = {"sharingStrategies": ["MPS"], "mpsDefaultPinnedDeviceMemoryLimit": "10Gi"}


@pytest.mark.parametrize("mps_config", [None, {"defaultActiveThreadPercentage": 50}])
def test_an_mps_claim_without_a_memory_limit_gets_the_default(mps_config: Any) -> None:
    sharing: dict[str, Any] = {"strategy": "MPS"}
    if mps_config is not None:
        sharing["mpsConfig"] = mps_config
    obj = resource_claim(claim_spec(exactly(), config=[gpu_config(sharing)]), namespace=NS, template=True)
    config = make_config(dra=MPS_ON)
    decision = decide(obj, "mutate", config=config)
    assert decision.allowed and decision.mutated == ("GPU009",)
    assert decision.warnings == ("gpu-stack GPU009: MPS claim: set mpsConfig.defaultPinnedDeviceMemoryLimit=10Gi "
                                 "(policy default)",)
    patched = apply_patch(obj, decision.patch)
    mps = patched["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"]["mpsConfig"]
    assert mps == {**(mps_config or {}), "defaultPinnedDeviceMemoryLimit": "10Gi"}
    again = decide(patched, "mutate", config=config)  # reinvoked: nothing added twice
    assert again.allowed and not again.patch and not again.warnings
    assert decide(patched, config=config).allowed and not decide(patched, config=config).warnings


def test_an_mps_claim_without_a_memory_limit_and_no_default_is_warned_about() -> None:
    obj = resource_claim(claim_spec(exactly(), config=[gpu_config({"strategy": "MPS"})]), namespace=NS)
    decision = decide(obj, "mutate", config=make_config(dra={"sharingStrategies": ["MPS"]}))
    assert decision.allowed and not decision.patch
    validated = decide(obj, config=make_config(dra={"sharingStrategies": ["MPS"]}))
    assert validated.allowed and validated.warned == ("GPU009",)


def test_update_keeps_what_create_allowed() -> None:
    obj = resource_claim(claim_spec(exactly(adminAccess=True)), namespace=NS)
    labelled = {**obj, "metadata": {**obj["metadata"], "labels": {"a": "b"}}}
    assert decide(labelled, operation="UPDATE", old=obj).allowed  # a label change on an old claim
    assert decide(labelled, operation="UPDATE", old=resource_claim(claim_spec(exactly()), namespace=NS)).denied_by \
        == ("GPU009",)


def test_gpu009_can_be_disabled() -> None:
    obj = resource_claim(claim_spec(exactly(adminAccess=True)), namespace=NS)
    assert decide(obj, config=make_config(rules={"disabled": ["GPU009"]})).allowed


def test_a_claim_without_spec_gets_a_400_not_a_crash() -> None:
    decision = decide({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                       "metadata": {"name": "x", "namespace": NS}})
    assert not decision.allowed and decision.code == 400 and not decision.crashed


def test_claim_lookups_are_cached_and_a_failure_is_retried_after_the_error_ttl() -> None:
    fake = FakeKube()
    fake.claims[(NS, "gpu")] = resource_claim(GPU_SPEC, "gpu", NS)
    now = [0.0]
    facts = ApiFacts(fake, ttl=30, error_ttl=5, clock=lambda: now[0])
    for _ in range(3):
        assert decide(_privileged_claim_pod(), facts=facts).denied_by == ("GPU003",)
    assert fake.count("read_resource_claim") == 1
    fake.unreachable = True
    now[0] = 31.0  # expired: asked again, unreachable, the fail-closed verdict says so
    assert "API unreachable" in decide(_privileged_claim_pod(), facts=facts).message
    fake.unreachable = False
    now[0] = 33.0  # the failure is kept for error_ttl
    assert "API unreachable" in decide(_privileged_claim_pod(), facts=facts).message
    now[0] = 37.0
    assert 'holding GPUs by claim "gpu" (ResourceClaim "gpu")' in decide(_privileged_claim_pod(), facts=facts).message


def test_a_claim_is_judged_by_its_device_class_name_whether_or_not_the_class_exists() -> None:
    """The GPU class list is the trust boundary: a class outside it (existing or not) gives no GPU; a listed
    one does before the driver's DeviceClass is installed (the claim then waits, as Kubernetes does)."""
    unknown = claim_spec(exactly("gpu", "no-such-class.example.com"))
    obj = pod(with_claims(container("main", privileged=True), "gpu"), claims=(claim_ref("gpu", claim="gpu"),))
    assert decide(obj, facts=cluster(gpu=unknown)).allowed
    assert decide(obj, facts=cluster(gpu=GPU_SPEC)).denied_by == ("GPU003",)  # no DeviceClass exists here
    missing_class = claim_spec({"name": "gpu", "exactly": {"allocationMode": "All"}})  # no deviceClassName
    assert decide(resource_claim(missing_class, namespace=NS)).allowed
