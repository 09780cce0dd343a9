"""The policy engine: from an admission request (or a plain object) to a Decision. No I/O.

/mutate judges Pods being created: it returns the patches the rules propose, and denies early only
what Kubernetes would reject before the validating webhooks run (listing every violation found).
/validate judges Pods and the pod templates of workloads: every denial, every warning. On UPDATE
only findings that the old object did not already have count, so a pod or workload that was fine
when it was created is never denied for a rule added later.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .admission import AdmissionRequest, Decision
from .config import PolicyConfig
from .facts import OFFLINE, ClusterFacts
from .findings import Finding, Severity
from .pod import POD_SPEC_LOCATIONS, NotAPodError, PodView
from .rules import RULES, Rule
from .rules.base import Context

# (API group, kind) of everything we judge; the pod spec location per kind is in pod.py.
JUDGED_KINDS: frozenset[tuple[str, str]] = frozenset(
    {("", "Pod")}
    | {("apps", k) for k in ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet")}
    | {("batch", k) for k in ("Job", "CronJob")}
)
assert {k for _, k in JUDGED_KINDS} == set(POD_SPEC_LOCATIONS)


class Endpoint(enum.Enum):
    MUTATE = "mutate"
    VALIDATE = "validate"


class RuleCrashed(Exception):
    def __init__(self, rule: Rule, error: BaseException) -> None:
        super().__init__(f"rule {rule.id} failed: {type(error).__name__}: {error}")
        self.rule = rule


@dataclass(frozen=True)
class Evaluation:
    findings: tuple[Finding, ...]

    @property
    def denials(self) -> list[Finding]:
        return [f for f in self.findings if f.denies]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.WARN]

    @property
    def patch(self) -> list[dict[str, Any]]:
        return [op for f in self.findings for op in f.patch]


def denial_message(denials: Iterable[Finding]) -> str:
    texts = [f.text for f in denials]
    if len(texts) == 1:
        return texts[0]
    return f"{len(texts)} GPU policy violations: " + "; ".join(f"[{i}] {t}" for i, t in enumerate(texts, 1))


def warning_text(finding: Finding) -> str:
    return f"gpu-stack {finding.rule_id}: {finding.message}"


class Policy:
    """A loaded config compiled once; `review` and `evaluate` are called per request."""

    def __init__(self, config: PolicyConfig, rules: Iterable[Rule] = RULES, facts: ClusterFacts = OFFLINE) -> None:
        self.config = config
        self.facts = facts
        disabled = set(config.rules.disabled)
        self.rules: tuple[Rule, ...] = tuple(r for r in rules if r.id not in disabled)
        self._patching = Context.for_config(config, can_patch=True)
        self._judging = Context(config=config, sharing=self._patching.sharing, can_patch=False)
        self._exempt = frozenset(config.exempt_namespaces)

    def evaluate(self, obj: Mapping[str, Any], kind: str, *, can_patch: bool = False, namespace: str = "",
                 facts: ClusterFacts | None = None) -> Evaluation:
        """Run every enabled rule on the pod spec of `obj`. Raises NotAPodError, RuleCrashed.
        `facts` (default: the policy's) answer cluster lookups for objects in `namespace`."""
        pod = PodView.of(obj, kind)
        ctx = self._patching if can_patch and kind == "Pod" else self._judging
        facts = self.facts if facts is None else facts
        if facts.online and namespace:
            ctx = replace(ctx, facts=facts, namespace=namespace)
        findings: list[Finding] = []
        for rule in self.rules:
            try:
                findings.extend(rule.check(pod, ctx))
            except Exception as error:  # a rule bug must become a decision, never a 500 traceback
                raise RuleCrashed(rule, error) from error
        return Evaluation(tuple(findings))

    def review(self, request: AdmissionRequest, endpoint: Endpoint, facts: ClusterFacts | None = None) -> Decision:
        skipped = self._skip_reason(request, endpoint)
        if skipped:
            return Decision(allowed=True, skipped=skipped)
        assert request.object is not None
        can_patch = endpoint is Endpoint.MUTATE and request.kind == "Pod" and request.operation == "CREATE"
        try:
            ns = request.namespace
            evaluation = self.evaluate(request.object, request.kind, can_patch=can_patch, namespace=ns, facts=facts)
            if request.operation == "UPDATE" and request.old_object is not None:
                evaluation = self._new_findings(evaluation, request.old_object, request.kind, ns, facts)
        except NotAPodError as error:
            return Decision(allowed=False, code=400, message=f"gpu-stack: {error}", rules=())
        except RuleCrashed as crash:
            return self._crashed(crash, endpoint)
        return self._decide(evaluation, endpoint)

    def _skip_reason(self, request: AdmissionRequest, endpoint: Endpoint) -> str:
        if request.operation not in ("CREATE", "UPDATE"):
            return f"operation {request.operation}"
        if (request.group, request.kind) not in JUDGED_KINDS:
            return f"kind {request.group or 'core'}/{request.kind}"
        if request.namespace in self._exempt:
            return f"namespace {request.namespace} is exempt"
        if request.object is None:
            return "no object"
        if request.sub_resource and request.sub_resource != "ephemeralcontainers":
            return f"subresource {request.sub_resource}"
        if endpoint is Endpoint.MUTATE and request.operation == "UPDATE":
            return "UPDATE is not mutated"
        return ""

    def _new_findings(self, evaluation: Evaluation, old_object: Mapping[str, Any], kind: str, namespace: str = "",
                      facts: ClusterFacts | None = None) -> Evaluation:
        try:
            before = set(self.evaluate(old_object, kind, namespace=namespace, facts=facts).findings)
        except NotAPodError:
            return evaluation
        return Evaluation(tuple(f for f in evaluation.findings if f not in before))

    def _decide(self, evaluation: Evaluation, endpoint: Endpoint) -> Decision:
        denials = evaluation.denials
        if endpoint is Endpoint.MUTATE:
            if any(f.deny_early for f in denials):
                return self._deny(denials)
            changes = [f for f in evaluation.warnings if f.patch or f.on_mutate]
            return Decision(
                allowed=True,
                warnings=tuple(warning_text(f) for f in changes),
                patch=tuple(evaluation.patch),
                rules=_rule_ids(changes),
                audit={"mutations": ",".join(_rule_ids(changes))} if changes else {},
            )
        if denials:
            return self._deny(denials, evaluation.warnings)
        warned = evaluation.warnings
        return Decision(
            allowed=True,
            warnings=tuple(warning_text(f) for f in warned),
            rules=_rule_ids(warned),
            audit={"warnings": ",".join(_rule_ids(warned))} if warned else {},
        )

    def _deny(self, denials: list[Finding], warnings: Iterable[Finding] = ()) -> Decision:
        warned = list(warnings)
        return Decision(
            allowed=False,
            code=403,
            message=denial_message(denials),
            warnings=tuple(warning_text(f) for f in warned),
            rules=_rule_ids([*denials, *warned]),
            audit={"denied-by": ",".join(_rule_ids(denials))},
        )

    @staticmethod
    def _crashed(crash: RuleCrashed, endpoint: Endpoint) -> Decision:
        if endpoint is Endpoint.MUTATE:
            return Decision(
                allowed=True,
                warnings=(f"gpu-stack: internal error in rule {crash.rule.id}; the pod was not mutated",),
                rules=(crash.rule.id,),
                audit={"internal-error": crash.rule.id},
            )
        return Decision(
            allowed=False,
            code=500,
            message=f"gpu-stack internal error in rule {crash.rule.id} (denied to fail closed): {crash}",
            rules=(crash.rule.id,),
            audit={"internal-error": crash.rule.id},
        )


def _rule_ids(findings: Iterable[Finding]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(f.rule_id for f in findings))
