"""The policy engine: a loaded config compiled once, run on the pod spec of an object. Pure, no I/O: the
same object and config give the same findings and patch (desired.py memoizes diffs in bounded,
thread-safe caches; see there).

`Policy.evaluate` runs every enabled rule and returns their findings (denials, warnings, changes) and,
for a Pod being created, the JSONPatch from the object to the pod the rules want (policy/desired.py);
what those mean for an admission request (skip, deny, patch, warn) is admission/decide.py's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from gpu_stack_webhook.policy.config import ConfigError, PolicyConfig
from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.desired import DesiredPod
from gpu_stack_webhook.policy.facts import ASKING_RULE, OFFLINE, ClusterFacts
from gpu_stack_webhook.policy.findings import Finding, JsonPatchOp, Severity
from gpu_stack_webhook.policy.pod import POD_SPEC_LOCATIONS, NotAPodError, PodView
from gpu_stack_webhook.policy.rules import RULE_IDS, RULES, Rule

# (API group, kind) of everything we judge; the pod spec location per kind is in pod.py.
JUDGED_KINDS: frozenset[tuple[str, str]] = frozenset(
    {("", "Pod")}
    | {("apps", k) for k in ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet")}
    | {("batch", k) for k in ("Job", "CronJob")}
)
assert {k for _, k in JUDGED_KINDS} == set(POD_SPEC_LOCATIONS)
# Dynamic Resource Allocation objects, judged by the rules with a check_object (GPU009), not as pods.
DRA_GROUP = "resource.k8s.io"
DRA_KINDS: frozenset[tuple[str, str]] = frozenset({(DRA_GROUP, "ResourceClaim"), (DRA_GROUP, "ResourceClaimTemplate")})
PATCHABLE_KINDS = frozenset({"Pod", "ResourceClaim", "ResourceClaimTemplate"})


class RuleCrashed(Exception):
    def __init__(self, rule: Rule, error: BaseException) -> None:
        super().__init__(f"rule {rule.id} failed: {type(error).__name__}: {error}")
        self.rule = rule


class Evaluation:
    """What the rules found and changed (a plain slotted class: compiled, cheaper to build and read than a
    NamedTuple, whose __new__ is generated Python). Not modified once built."""

    __slots__ = ("findings", "patch")

    def __init__(self, findings: tuple[Finding, ...], patch: tuple[JsonPatchOp, ...] = ()) -> None:
        self.findings = findings
        # RFC 6902 ops from the object to the desired pod (jsonpatch's diff); only ever for a Pod being created.
        self.patch = patch

    def __repr__(self) -> str:
        return f"Evaluation(findings={self.findings!r}, patch={self.patch!r})"

    @property
    def denials(self) -> list[Finding]:
        return [f for f in self.findings if f.denies]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.WARN]


class Policy:
    """A loaded config compiled once; `evaluate` (and `new_findings` on UPDATE) are called per request, by
    admission/decide.py's `review`."""

    def __init__(self, config: PolicyConfig, rules: Iterable[Rule] = RULES, facts: ClusterFacts = OFFLINE) -> None:
        """Raises ConfigError when `rules.disabled` names a rule that does not exist (checked here, where
        config and rules meet: the rules import config.py, so config.py cannot know their IDs)."""
        rules = tuple(rules)
        disabled = set(config.rules.disabled)
        known = RULE_IDS | {r.id for r in rules}
        if unknown := sorted(disabled - known):
            raise ConfigError(f"invalid policy config: rules.disabled: unknown rule IDs {unknown}; "
                              f"known: {sorted(known)}")
        self.config = config
        self.facts = facts
        self.rules: tuple[Rule, ...] = tuple(r for r in rules if r.id not in disabled)
        self._mutating = tuple(r for r in self.rules if r.mutating)
        self._patching = Context.for_config(config, can_patch=True)
        self._judging = Context(config=config, sharing=self._patching.sharing, can_patch=False)
        self._exempt = frozenset(config.exempt_namespaces)

    def evaluate(self, obj: Mapping[str, Any], kind: str, *, can_patch: bool = False, namespace: str = "",
                 facts: ClusterFacts | None = None, mutating_only: bool = False) -> Evaluation:
        """Run every enabled rule (`mutating_only`: those that may change the pod or deny early) on the
        pod spec of `obj` (for a ResourceClaim or ResourceClaimTemplate: the rules' check_object on the
        object). Raises NotAPodError, RuleCrashed. `facts` (default: the policy's) answer cluster lookups
        for objects in `namespace`."""
        patching = can_patch and kind in PATCHABLE_KINDS
        ctx = self._patching if patching else self._judging
        facts = self.facts if facts is None else facts
        if namespace and (facts.online or facts is not OFFLINE or kind in ("ResourceClaim", "ResourceClaimTemplate")):
            # Offline facts other than OFFLINE (DocumentFacts) answer claims only; GPU009 reads the namespace.
            ctx = replace(ctx, facts=facts, namespace=namespace)
        if kind in ("ResourceClaim", "ResourceClaimTemplate"):
            return self._evaluate_object(obj, kind, ctx, patching, mutating_only)
        pod = PodView.of(obj, kind, patchable=patching)
        findings: list[Finding] = []
        for rule in self._mutating if mutating_only else self.rules:
            asking = ASKING_RULE.set(rule.id)
            try:
                findings.extend(rule.check(pod, ctx))
            except Exception as error:  # a rule bug must become a decision, never a 500 traceback
                raise RuleCrashed(rule, error) from error
            finally:
                ASKING_RULE.reset(asking)
        return Evaluation(tuple(findings), pod.desired.patch())

    def _evaluate_object(self, obj: Mapping[str, Any], kind: str, ctx: Context, patching: bool,
                         mutating_only: bool) -> Evaluation:
        if not isinstance(obj.get("spec"), dict):
            raise NotAPodError(f"{kind} has no spec")
        desired = DesiredPod(obj, writable=patching)
        findings: list[Finding] = []
        for rule in self._mutating if mutating_only else self.rules:
            if rule.check_object is None:
                continue
            try:
                findings.extend(rule.check_object(dict(obj), kind, desired, ctx))
            except Exception as error:  # a rule bug must become a decision, never a 500 traceback
                raise RuleCrashed(rule, error) from error
        return Evaluation(tuple(findings), desired.patch())

    def new_findings(self, evaluation: Evaluation, old_object: Mapping[str, Any], kind: str, namespace: str = "",
                     facts: ClusterFacts | None = None) -> Evaluation:
        """Only the findings `old_object` did not already have (UPDATE: an object that was fine when it
        was created is never denied for a rule added later)."""
        try:
            before = set(self.evaluate(old_object, kind, namespace=namespace, facts=facts).findings)
        except NotAPodError:
            return evaluation
        return Evaluation(tuple(f for f in evaluation.findings if f not in before), evaluation.patch)

    def is_exempt(self, namespace: str) -> bool:
        return namespace in self._exempt
