"""The chart's CEL admission policies (webhook.validation.mode, webhook.mutation.mode)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from gpu_stack_dev.chartlib import FULLNAME, find, one, overlays, render, run_helm, template_args
from gpu_stack_webhook.cel import mutating, validating
from gpu_stack_webhook.cel.library import config_values
from gpu_stack_webhook.policy.config import parse_config

SERVED = {"webhook.cel.assumeServed": True}
ALL_CEL = {**SERVED, "webhook.validation.mode": "cel", "webhook.mutation.mode": "cel"}
WEBHOOK_KINDS = ("Deployment", "Service", "PodDisruptionBudget", "Certificate", "Issuer", "NetworkPolicy")


def _webhook_objects(objects: list[dict[str, Any]]) -> list[str]:
    return [f"{o['kind']}/{o['metadata']['name']}" for o in objects
            if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "webhook"]


@pytest.mark.parametrize("overlay", overlays())
def test_config_variables_are_what_the_python_config_gives(overlay: str) -> None:
    """The chart computes the policies' config variables from the same policy the webhook reads."""
    # Policy only (docs/gpu-operator.md): the webhook mutates, reading the cluster; the chart refuses cel there.
    policy_only = overlay.startswith("policy-only-")
    settings = {**SERVED, "webhook.validation.mode": "both",
                "webhook.mutation.mode": "webhook" if policy_only else "cel"}
    objects = render(4, overlay, settings).objects()
    policy = yaml.safe_load(one(objects, "ConfigMap", f"{FULLNAME}-webhook-policy")["data"]["policy.yaml"])
    expected = config_values(parse_config(policy))
    # Not the DRA driver's ResourceSlice policy (templates/dra/, dra.enabled): it has no config variables.
    policies = [o for o in find(objects, "ValidatingAdmissionPolicy") + find(objects, "MutatingAdmissionPolicy")
                if o["metadata"]["name"] != f"{FULLNAME}-dra-resourceslices"]
    assert len(policies) == len(validating.POLICIES) + (0 if policy_only else len(mutating.POLICIES))
    seen = set()
    for obj in policies:
        for variable in obj["spec"]["variables"]:
            if variable["name"] in expected:
                seen.add(variable["name"])
                assert json.loads(variable["expression"]) == expected[variable["name"]], (overlay, variable["name"])
    # disabledRules, nonGpuRuntimeClassNames and gpuResourcePattern are read by the webhooks' matchConditions only
    # (tests/chart/test_match_conditions.py).
    if policy_only:  # the validating policies' variables only
        assert seen and seen < set(expected)
        return
    assert seen == set(expected) - {"disabledRules", "nonGpuRuntimeClassNames", "gpuResourcePattern"}


def test_both_modes_cel_render_no_webhook_at_all() -> None:
    objects = render(4, "default", ALL_CEL).objects()
    assert _webhook_objects(objects) == []
    assert not find(objects, "ValidatingWebhookConfiguration") and not find(objects, "MutatingWebhookConfiguration")
    names = sorted(o["metadata"]["name"] for o in find(objects, "ValidatingAdmissionPolicy"))
    # One policy per rule with a CEL twin (policy/rules/), named by its ID.
    assert names == [f"{FULLNAME}-{p.rule_id.lower()}" for p in validating.POLICIES]
    # A "dra" twin (GPU009) judges the DRA claims themselves; the others Pods and workloads.
    dra = {f"{FULLNAME}-{p.rule_id.lower()}" for p in validating.POLICIES if p.target == "dra"}
    assert dra
    rules = {o["metadata"]["name"]: o["spec"]["matchConstraints"]["resourceRules"]
             for o in find(objects, "ValidatingAdmissionPolicy")}
    assert all(rules[n] == [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                             "operations": ["CREATE", "UPDATE"],
                             "resources": ["resourceclaims", "resourceclaimtemplates"]}] for n in dra)
    assert all(r[0]["resources"] == ["pods"] for n, r in rules.items() if n not in dra)
    assert sorted(o["spec"]["policyName"] for o in find(objects, "ValidatingAdmissionPolicyBinding")) == names
    mutations = find(objects, "MutatingAdmissionPolicy")
    assert sorted(o["metadata"]["name"] for o in mutations) == [
        f"{FULLNAME}-{p.rule_id.lower()}-mutate" for p in mutating.POLICIES]
    for policy in (p for p in mutating.POLICIES if p.target == "dra"):
        claims = one(objects, "MutatingAdmissionPolicy", f"{FULLNAME}-{policy.rule_id.lower()}-mutate")
        assert claims["spec"]["matchConstraints"]["resourceRules"] == [{
            "apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
            "resources": ["resourceclaims", "resourceclaimtemplates"]}]
    assert {o["spec"]["reinvocationPolicy"] for o in mutations} == {"IfNeeded"}


def test_bindings_skip_the_namespaces_the_webhook_skips_and_take_the_actions_value() -> None:
    settings = {**SERVED, "webhook.validation.mode": "both", "webhook.validation.celActions": ["Warn", "Audit"],
                "webhook.policy.extraExemptNamespaces": ["batch"]}
    objects = render(4, "default", settings).objects()
    webhook_selector = one(objects, "ValidatingWebhookConfiguration", f"{FULLNAME}-webhook")["webhooks"][0][
        "namespaceSelector"]
    for binding in find(objects, "ValidatingAdmissionPolicyBinding"):
        assert binding["spec"]["matchResources"]["namespaceSelector"] == webhook_selector
        assert binding["spec"]["validationActions"] == ["Warn", "Audit"]
    assert "batch" in webhook_selector["matchExpressions"][0]["values"]


@pytest.mark.parametrize(("validation", "mutation", "vwc", "mwc", "args"), [
    ("webhook", "webhook", True, True, {"--mutating-webhook-configuration", "--validating-webhook-configuration"}),
    ("cel", "webhook", False, True, {"--mutating-webhook-configuration"}),
    ("both", "cel", True, False, {"--validating-webhook-configuration"}),
])
def test_each_mode_registers_only_its_webhooks(validation: str, mutation: str, vwc: bool, mwc: bool,
                                               args: set[str]) -> None:
    objects = render(4, "default", {**SERVED, "webhook.validation.mode": validation,
                                    "webhook.mutation.mode": mutation}).objects()
    assert bool(find(objects, "ValidatingWebhookConfiguration")) is vwc
    assert bool(find(objects, "MutatingWebhookConfiguration")) is mwc
    assert bool(find(objects, "ValidatingAdmissionPolicy")) is (validation != "webhook")
    assert bool(find(objects, "MutatingAdmissionPolicy")) is (mutation == "cel")
    container = one(objects, "Deployment", f"{FULLNAME}-webhook")["spec"]["template"]["spec"]["containers"][0]
    assert {a for a in container["args"] if a.endswith("-webhook-configuration")} == args


def test_cel_modes_need_the_apis_served() -> None:
    """helm template sees no cluster: without --api-versions (or assumeServed) the render says what to do."""
    failed = run_helm(4, template_args(set_json={"webhook.validation.mode": "cel"}))
    assert not failed.ok and "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy" in failed.stderr
    ok = run_helm(4, [*template_args(set_json={"webhook.validation.mode": "cel", "webhook.mutation.mode": "cel"}),
                      "--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
                      "--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"])
    assert ok.ok, ok.stderr
    failed = run_helm(4, [*template_args(set_json={"webhook.mutation.mode": "cel"})])
    assert not failed.ok and "MutatingAdmissionPolicy (Kubernetes >= 1.36; found Kubernetes v1." in failed.stderr
    assert not find(render(4).objects(), "ValidatingAdmissionPolicy")  # default: webhook only
