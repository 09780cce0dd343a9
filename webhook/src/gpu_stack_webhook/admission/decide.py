"""From an admission request to a Decision (defined here): which requests are judged, and what the findings mean.

/mutate judges Pods being created: it returns the patches the rules propose, and denies early only
what Kubernetes would reject before the validating webhooks run (listing every violation found).
/validate judges Pods and the pod templates of workloads: every denial, every warning. ResourceClaims
and ResourceClaimTemplates (resource.k8s.io) are judged as themselves (GPU009), and patched at /mutate
on CREATE like a Pod. On UPDATE
only findings that the old object did not already have count, so a pod or workload that was fine
when it was created is never denied for a rule added later; except a write that would borrow the GPU
Operator's standing (policy/operator_owned.py `borrowed`): it is refused, and judged in full.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from typing import Literal

from gpu_stack_webhook.admission.review import AdmissionRequest
from gpu_stack_webhook.policy.engine import DRA_KINDS, JUDGED_KINDS, PATCHABLE_KINDS, Evaluation, Policy, RuleCrashed
from gpu_stack_webhook.policy.facts import ClusterFacts
from gpu_stack_webhook.policy.findings import Finding, JsonPatchOp
from gpu_stack_webhook.policy.operator_owned import borrowed, operator_owned
from gpu_stack_webhook.policy.pod import NotAPodError

Outcome = Literal["allowed", "denied", "patched", "skipped", "error"]
# `Decision.crashed` when the failure was outside the rules (no rule to name).
WEBHOOK_FAILURE = "webhook"


class Decision:
    """The verdict on one request, structured: the response, the audit annotations, the metrics and the
    decision log are all derived from these fields (never from each other's text). Not modified once
    built (a plain slotted class, like review.py's AdmissionRequest)."""

    __slots__ = ("allowed", "code", "crashed", "denied_by", "message", "mutated", "patch", "skipped", "warned",
                 "warnings")

    def __init__(self, allowed: bool, *, code: int = 200, message: str = "", warnings: tuple[str, ...] = (),
                 patch: tuple[JsonPatchOp, ...] = (), denied_by: tuple[str, ...] = (), warned: tuple[str, ...] = (),
                 mutated: tuple[str, ...] = (), crashed: str = "", skipped: str = "") -> None:
        self.allowed = allowed
        self.code = code
        self.message = message
        self.warnings = warnings
        self.patch = patch
        # Rule IDs by role: the denials, the warnings (/validate), the changes and their notes (/mutate).
        self.denied_by = denied_by
        self.warned = warned
        self.mutated = mutated
        # The rule that raised (or WEBHOOK_FAILURE): the answer is the fail-closed one.
        self.crashed = crashed
        # Why the object was not judged at all (exempt namespace, operation, kind), for logs.
        self.skipped = skipped

    def __repr__(self) -> str:
        return f"Decision({self.outcome}, code={self.code}, rules={self.rules})"

    @property
    def outcome(self) -> Outcome:
        if self.crashed:
            return "error"
        if self.skipped:
            return "skipped"
        if not self.allowed:
            return "denied"
        return "patched" if self.patch else "allowed"

    @property
    def rules(self) -> tuple[str, ...]:
        """Every rule that reported, once, in the order crashed, denied, warned, mutated."""
        crashed = (self.crashed,) if self.crashed and self.crashed != WEBHOOK_FAILURE else ()
        return tuple(dict.fromkeys((*crashed, *self.denied_by, *self.warned, *self.mutated)))

    def severities(self) -> Iterator[tuple[str, str]]:
        """(rule, severity) for every rule that reported: error (it crashed), deny or warn."""
        for rule in self.rules:
            yield rule, ("error" if rule == self.crashed else "deny" if rule in self.denied_by else "warn")

    @property
    def audit(self) -> dict[str, str]:
        """The auditAnnotations (keys without a prefix: the API server adds the webhook's name)."""
        if self.crashed:
            return {"internal-error": self.crashed}
        if self.denied_by:
            return {"denied-by": ",".join(self.denied_by)}
        if self.mutated:
            return {"mutations": ",".join(self.mutated)}
        if self.warned:
            return {"warnings": ",".join(self.warned)}
        return {}


class Endpoint(enum.Enum):
    MUTATE = "mutate"
    VALIDATE = "validate"


def review(policy: Policy, request: AdmissionRequest, endpoint: Endpoint,
           facts: ClusterFacts | None = None) -> Decision:
    """The decision for one request. `facts` (default: the policy's) answer the rules' cluster lookups."""
    skipped = skip_reason(policy, request, endpoint) or _operator_owned(policy, request, facts)
    if skipped:
        return Decision(allowed=True, skipped=skipped)
    assert request.object is not None
    borrowing = _borrowed(policy, request, facts) if endpoint is Endpoint.VALIDATE else ""
    mutating = endpoint is Endpoint.MUTATE
    can_patch = mutating and request.kind in PATCHABLE_KINDS and request.operation == "CREATE"
    ns = request.namespace
    try:
        # /mutate keeps changes and early denials only, so it runs the rules that make them; an early
        # denial lists every violation, so then all of them run.
        evaluation = policy.evaluate(request.object, request.kind, can_patch=can_patch, namespace=ns, facts=facts,
                                     mutating_only=mutating)
        if mutating and any(f.deny_early for f in evaluation.findings):
            evaluation = policy.evaluate(request.object, request.kind, can_patch=can_patch, namespace=ns, facts=facts)
        if request.operation == "UPDATE" and request.old_object is not None and not borrowing:
            evaluation = policy.new_findings(evaluation, request.old_object, request.kind, ns, facts)
    except NotAPodError as error:
        return Decision(allowed=False, code=400, message=f"gpu-stack: {error}")
    except RuleCrashed as crash:
        return _crashed(crash, endpoint)
    if borrowing:
        return _refuse_borrowing(borrowing, evaluation)
    return _decide(evaluation, endpoint)


def skip_reason(policy: Policy, request: AdmissionRequest, endpoint: Endpoint) -> str:
    if request.operation not in ("CREATE", "UPDATE"):
        return f"operation {request.operation}"
    if (request.group, request.kind) not in JUDGED_KINDS and (request.group, request.kind) not in DRA_KINDS:
        return f"kind {request.group or 'core'}/{request.kind}"
    if policy.is_exempt(request.namespace):
        return f"namespace {request.namespace} is exempt"
    if request.object is None:
        return "no object"
    if request.sub_resource and request.sub_resource != "ephemeralcontainers":
        return f"subresource {request.sub_resource}"
    if endpoint is Endpoint.MUTATE and request.operation == "UPDATE":
        return "UPDATE is not mutated"
    return ""


def _operator_owned(policy: Policy, request: AdmissionRequest, facts: ClusterFacts | None) -> str:
    assert request.object is not None
    why = operator_owned(policy.config.gpu_operator, request.username, request.kind, request.namespace,
                         obj=request.object, facts=policy.facts if facts is None else facts)
    return f"the GPU Operator's own: {why}" if why else ""


def _borrowed(policy: Policy, request: AdmissionRequest, facts: ClusterFacts | None) -> str:
    assert request.object is not None
    return borrowed(policy.config.gpu_operator, request.username, request.operation, request.kind, request.namespace,
                    obj=request.object, old=request.old_object, facts=policy.facts if facts is None else facts)


def _refuse_borrowing(why: str, evaluation: Evaluation) -> Decision:
    """A write that would borrow the operator's standing (policy/operator_owned.py): refused, and judged in full
    like any user's object (no leniency for what the old object already had), every violation named too."""
    denials = evaluation.denials
    message = f"gpu-stack: {why}" + (f"; and judged as any user's: {denial_message(denials)}" if denials else "")
    warned = evaluation.warnings
    return Decision(allowed=False, code=403, message=message, warnings=tuple(warning_text(f) for f in warned),
                    denied_by=_rule_ids(denials), warned=_rule_ids(warned))


def denial_message(denials: Iterable[Finding]) -> str:
    texts = [f.text for f in denials]
    if len(texts) == 1:
        return texts[0]
    return f"{len(texts)} GPU policy violations: " + "; ".join(f"[{i}] {t}" for i, t in enumerate(texts, 1))


def warning_text(finding: Finding) -> str:
    return f"gpu-stack {finding.rule_id}: {finding.message}"


ALLOWED = Decision(allowed=True)


def _decide(evaluation: Evaluation, endpoint: Endpoint) -> Decision:
    if not evaluation.findings:  # most reviews: nothing to deny, warn or change
        return ALLOWED
    denials = evaluation.denials
    if endpoint is Endpoint.MUTATE:
        if denials and any(f.deny_early for f in denials):
            return _deny(denials)
        changes = [f for f in evaluation.warnings if f.changed or f.on_mutate]
        return Decision(
            allowed=True,
            warnings=tuple(warning_text(f) for f in changes),
            patch=evaluation.patch,
            mutated=_rule_ids(changes),
        )
    if denials:
        return _deny(denials, evaluation.warnings)
    warned = evaluation.warnings
    return Decision(
        allowed=True,
        warnings=tuple(warning_text(f) for f in warned),
        warned=_rule_ids(warned),
    )


def _deny(denials: list[Finding], warnings: Iterable[Finding] = ()) -> Decision:
    warned = list(warnings)
    return Decision(
        allowed=False,
        code=403,
        message=denial_message(denials),
        warnings=tuple(warning_text(f) for f in warned),
        denied_by=_rule_ids(denials),
        warned=_rule_ids(warned),
    )


def _crashed(crash: RuleCrashed, endpoint: Endpoint) -> Decision:
    if endpoint is Endpoint.MUTATE:
        return Decision(
            allowed=True,
            warnings=(f"gpu-stack: internal error in rule {crash.rule.id}; the pod was not mutated",),
            crashed=crash.rule.id,
        )
    return Decision(
        allowed=False,
        code=500,
        message=f"gpu-stack internal error in rule {crash.rule.id} (denied to fail closed): {crash}",
        crashed=crash.rule.id,
    )


def internal_error(endpoint: Endpoint) -> Decision:
    """A failure outside the rules, once the uid is known: /validate denies (fail closed), /mutate allows
    unchanged with a warning (the validating pass still judges the object)."""
    if endpoint is Endpoint.MUTATE:
        return Decision(allowed=True, warnings=("gpu-stack: internal error; the object was not mutated",),
                        crashed=WEBHOOK_FAILURE)
    return Decision(allowed=False, code=500, message="gpu-stack: internal error (denied to fail closed)",
                    crashed=WEBHOOK_FAILURE)


def _rule_ids(findings: Iterable[Finding]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(f.rule_id for f in findings))
