"""The generated CEL policies decide like the Python rules (gpu_stack_webhook.cel, evaluated offline).

- Validation: for any judged kind (CREATE, and UPDATE with an oldObject), under every test policy
  config, the denial texts of the CEL ValidatingAdmissionPolicies (every rule module's CEL_VALIDATION)
  are exactly the Python rules' denial texts for those rules on /validate: same verdict, same messages.
- Mutation: for a Pod being created, applying the MutatingAdmissionPolicies (limit fill, MPS injection,
  runtime class) gives the same pod as the webhook's /mutate patch. Where /mutate denies (GPU001's
  early denials, GPU006's conflicts), CEL cannot deny: the API server's own validation refuses a
  GPU001 case, and the test says which GPU006 cases stay webhook-only.

`make test` runs 100 derandomized cases per property; `make fuzz` CEL_FUZZ_EXAMPLES (default 10,000)
pods through validation and mutation, and a fifth of that as UPDATEs.
"""

from __future__ import annotations

import copy
import os
from collections import Counter
from functools import cache
from typing import Any

import jsonpatch
import pytest
from gpu_stack_webhook.cel import mutating, runtime, validating
from gpu_stack_webhook.cel.library import config_values
from gpu_stack_webhook.policy.engine import Policy
from hypothesis import given, settings
from hypothesis import strategies as st

from . import counting
from .strategies import API, claims, pods, wrap
from .test_properties import CONFIGS, _config
from .test_side_door_properties import capability_spellings

# make fuzz: CEL_FUZZ_EXAMPLES pods (default 10,000) for CREATE, a fifth of that for UPDATE (two pods each).
_FUZZ_COUNT = int(os.environ.get("CEL_FUZZ_EXAMPLES", "10000"))
_FUZZING = settings.get_current_profile_name() == "fuzz"  # loaded by conftest.py
FUZZ = settings(max_examples=_FUZZ_COUNT) if _FUZZING else settings()
UPDATE_FUZZ = settings(max_examples=max(_FUZZ_COUNT // 5, 100)) if _FUZZING else settings()
CEL_RULES = frozenset(p.rule_id for p in validating.POLICIES)
config_names = st.sampled_from(sorted(CONFIGS))


@cache
def _values(name: str) -> dict[str, Any]:
    return config_values(_config(name))


@cache
def _policy(name: str) -> Policy:
    return Policy(_config(name))


@st.composite
def gpu_pods(draw: st.DrawFn) -> dict[str, Any]:
    """pods() with capability spellings of every kind in some containers' capabilities.add."""
    pod = draw(pods())
    spec = pod["spec"]
    for field in ("containers", "initContainers", "ephemeralContainers"):
        for container in spec.get(field, []):
            if draw(st.integers(0, 3)) == 0:
                added = [draw(capability_spellings())[0] for _ in range(draw(st.integers(1, 2)))]
                added = [a for a in added if isinstance(a, str)]  # the schema wants strings
                context = container.setdefault("securityContext", {})
                context["capabilities"] = {**context.get("capabilities", {}), "add": added}
    return pod


def python_denials(config: str, obj: dict[str, Any], old: dict[str, Any] | None = None) -> Counter[str]:
    policy = _policy(config)
    kind = obj["kind"]
    evaluation = policy.evaluate(obj, kind)
    if old is not None:
        evaluation = policy.new_findings(evaluation, old, kind)
    return Counter(f.text for f in evaluation.denials if f.rule_id in CEL_RULES)


def cel_denials(config: str, obj: dict[str, Any], old: dict[str, Any] | None = None) -> Counter[str]:
    found: Counter[str] = Counter()
    claim = obj["kind"] in ("ResourceClaim", "ResourceClaimTemplate")
    for policy in validating.POLICIES:
        if (policy.target == "dra") != claim:
            continue  # the policy's matchConstraints do not match the object
        found.update(runtime.violations(policy, _values(config), obj, old))
    return found


@FUZZ
@given(pod=gpu_pods(), kind=st.sampled_from(tuple(API)), config=config_names)
def test_cel_policies_decide_and_mutate_like_the_webhook(pod: dict[str, Any], kind: str, config: str) -> None:
    """One generated pod, both properties: validation (as `kind`) and mutation (as a Pod)."""
    counting.tick()
    obj = wrap(pod, kind)
    assert cel_denials(config, obj) == python_denials(config, obj)
    check_mutation(config, pod)


@UPDATE_FUZZ
@given(pod=gpu_pods(), before=gpu_pods(), kind=st.sampled_from(tuple(API)), config=config_names)
def test_cel_validation_on_update_counts_only_new_violations(pod: dict[str, Any], before: dict[str, Any],
                                                             kind: str, config: str) -> None:
    counting.tick()
    obj, old = wrap(pod, kind), wrap(before, kind)
    if kind == "Pod" and before["metadata"]["name"] < pod["metadata"]["name"]:
        old = copy.deepcopy(obj)  # the kubectl debug shape: the same pod without its ephemeral containers
        old["spec"].pop("ephemeralContainers", None)
    assert cel_denials(config, obj, old) == python_denials(config, obj, old)


@FUZZ
@given(claim=claims(), before=claims(), config=config_names, update=st.booleans())
def test_cel_judges_dra_claims_like_the_webhook(claim: dict[str, Any], before: dict[str, Any], config: str,
                                                update: bool) -> None:
    """GPU009 on generated ResourceClaims and ResourceClaimTemplates: the same denial texts, CREATE and UPDATE,
    and the same claim after the MPS memory-limit default."""
    counting.tick()
    old = None
    if update:
        old = {**before, "kind": claim["kind"], "metadata": claim["metadata"]}
        if claim["kind"] != before["kind"]:
            template = before["kind"] == "ResourceClaimTemplate"
            old["spec"] = before["spec"]["spec"] if template else {"spec": before["spec"]}
    assert cel_denials(config, claim, old) == python_denials(config, claim, old)
    # CREATE at /mutate: the MPS memory-limit default (GPU009's MutatingAdmissionPolicy).
    expected = jsonpatch.apply_patch(claim, _policy(config).evaluate(claim, claim["kind"], can_patch=True).patch)
    mutated = cel_mutated(config, claim)
    assert mutated == expected
    assert cel_mutated(config, mutated) == mutated


_DRA = "deviceclass.resource.kubernetes.io/"


@pytest.mark.parametrize("classes", [("mig.nvidia.com", "gpu.nvidia.com"), ("gpu.nvidia.com", "mig.nvidia.com")])
def test_two_dra_resources_are_named_in_the_same_order_by_both(classes: tuple[str, str]) -> None:
    """GPU002 and GPU003 name every DRA resource a pod holds GPUs by; a CEL map's keys have no set order,
    so both sides name them sorted, whatever order the manifest gives (this once differed)."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "d"}, "spec": {"containers": [{
        "name": "a", "image": "x", "securityContext": {"privileged": True},
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        "resources": {"limits": {_DRA + c: "1" for c in classes}}}]}}
    obj = wrap(pod, "Pod")
    denials = python_denials("default", obj)
    assert {t.split()[0] for t in denials} == {"GPU002", "GPU003"}
    assert all(f"{_DRA}gpu.nvidia.com, {_DRA}mig.nvidia.com" in t for t in denials)
    assert cel_denials("default", obj) == denials


def cel_mutated(config: str, pod: dict[str, Any]) -> dict[str, Any]:
    claim = pod["kind"] in ("ResourceClaim", "ResourceClaimTemplate")
    for policy in mutating.POLICIES:
        if (policy.target == "dra") == claim:
            pod, _ops = runtime.mutate(policy, _values(config), pod)
    return pod


def check_mutation(config: str, pod: dict[str, Any]) -> None:
    evaluation = _policy(config).evaluate(pod, "Pod", can_patch=True)
    early = [f for f in evaluation.denials if f.deny_early]
    mutated = cel_mutated(config, pod)
    if early:
        # /mutate denies. GPU001's early denials are what the API server's validation refuses anyway
        # (fractions, request != limit); the only GPU006 one offline is an MPS opt-in whose nodeSelector
        # excludes MPS nodes, which CEL leaves unpatched (webhook-only, README).
        assert {f.rule_id for f in early} <= {"GPU001", "GPU006"}
        assert all("excludes MPS nodes" in f.message for f in early if f.rule_id == "GPU006")
        return
    expected = jsonpatch.apply_patch(pod, evaluation.patch)
    assert mutated == expected
    # Reinvocation adds nothing twice: the policies on their own result change nothing.
    assert cel_mutated(config, mutated) == mutated
