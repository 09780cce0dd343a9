"""`gpu-stack-webhook check --engine cel`: what the API server does with the chart's CEL policies
(webhook.validation.mode=cel, webhook.mutation.mode=cel) when an object is created, offline.

A Pod first goes through the MutatingAdmissionPolicies (limit fill, MPS, runtime class); then every
ValidatingAdmissionPolicy matching it (GPU009 for ResourceClaims and ResourceClaimTemplates, the others
for Pods and workloads) judges the object, and the first that denies answers, in the words kubectl
prints for a policy denial. Exempt namespaces and kinds the policies do not match are skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_stack_webhook.cel import mutating, runtime, validating
from gpu_stack_webhook.cel.library import config_values
from gpu_stack_webhook.policy.cel_twin import CelValidation
from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.engine import DRA_KINDS, JUDGED_KINDS
from gpu_stack_webhook.policy.pod import POD_SPEC_LOCATIONS

POLICY_PREFIX = "gpu-stack"  # the policy names of a release called gpu-stack (the README's install command)


@dataclass
class CelOutcome:
    outcome: str  # allowed | patched | denied | skipped
    detail: str = ""
    errors: list[str] = field(default_factory=list)
    patch: list[dict[str, Any]] = field(default_factory=list)


def _group(obj: Mapping[str, Any]) -> str:
    api_version = str(obj.get("apiVersion") or "")
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def evaluate_object(config: PolicyConfig, obj: Mapping[str, Any], source: str, namespace: str) -> CelOutcome:
    kind = str(obj.get("kind"))
    claim = (_group(obj), kind) in DRA_KINDS
    if not claim and ((_group(obj), kind) not in JUDGED_KINDS or kind not in POD_SPEC_LOCATIONS):
        return CelOutcome("skipped", f"kind {_group(obj) or 'core'}/{kind}")
    if namespace in config.exempt_namespaces:
        return CelOutcome("skipped", f"namespace {namespace} is exempt")
    values = config_values(config)
    result = CelOutcome("allowed")
    target: dict[str, Any] = dict(obj)
    try:
        if kind == "Pod" or claim:
            for mutation in mutating.POLICIES:
                if (mutation.target == "dra") != claim:
                    continue
                target, ops = runtime.mutate(mutation, values, target)
                result.patch.extend(ops)
        if result.patch:
            result.outcome = "patched"
        for policy in validating.POLICIES:
            if (policy.target == "dra") != claim:
                continue
            found = runtime.violations(policy, values, target)
            if found:
                return _denied(result, policy, found, target, source)
    except runtime.CelError as error:
        result.outcome = "denied"
        result.errors.append(f'Error from server (InternalError): error when creating "{source}": CEL policy '
                             f"evaluation failed (failurePolicy Fail): {error}")
    return result


def _denied(result: CelOutcome, policy: CelValidation, found: list[str], obj: Mapping[str, Any],
            source: str) -> CelOutcome:
    message = found[0] if len(found) == 1 else (
        f"{len(found)} GPU policy violations: " + "; ".join(f"[{i}] {t}" for i, t in enumerate(found, 1)))
    name = f"{POLICY_PREFIX}-{policy.rule_id.lower()}"
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    resource = f'{str(obj.get("kind")).lower()}s "{meta.get("name") or meta.get("generateName") or ""}"'
    result.outcome = "denied"
    result.errors.append(f'Error from server (Forbidden): error when creating "{source}": {resource} is forbidden: '
                         f"ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request: {message}")
    return result
