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
from typing import Any, Final

from gpu_stack_webhook.policy.config import ConfigError, PolicyConfig
from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.desired import DesiredPod
from gpu_stack_webhook.policy.facts import ASKING_RULE, OFFLINE, AskingRule, ClusterFacts
from gpu_stack_webhook.policy.findings import Finding, JsonPatchOp, Severity
from gpu_stack_webhook.policy.pod import POD_SPEC_LOCATIONS, NotAPodError, PodView
from gpu_stack_webhook.policy.rules import RULE_IDS, RULES, Rule
from gpu_stack_webhook.policy.signals import SIGNALS, Signal

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
# The order the scope gate asks a pod's signals in: a pod naming a GPU resource answers the first for the mutating
# rules and the second for the others but GPU009.
GATE_ORDER: Final = (Signal.GPU_RESOURCES, Signal.GPU_POD, Signal.NVIDIA_RUNTIME, Signal.MPS_SELECTION,
                     Signal.CDI_ANNOTATION, Signal.DRA_OBJECT)
assert set(GATE_ORDER) == set(Signal), "GATE_ORDER lists every signal: a rule gated on one left out never runs"
# Final: compiled, a module global that is not Final is read from the module's dict at every use (carries reads
# these several times per rule; callgrind counted ~38 such reads per review of a pod without GPUs).
_PREDICATES: Final = tuple(SIGNALS[signal].python for signal in GATE_ORDER)
# What the gate knows of a signal during one evaluation (a list indexed like GATE_ORDER: a Signal is an Enum,
# whose hash is a Python method, too slow to key a dict read for every rule of every review).
NOT_ASKED: Final = 0
CARRIED: Final = 1
ABSENT: Final = 2


class Gated:
    """A rule with the signals of its SCOPE as indices into GATE_ORDER: the engine runs it on a pod carrying one.
    A rule whose scope is every signal (Rule's default: a rule that declares none) runs on every pod."""

    __slots__ = ("always", "rule", "signals")

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.always = rule.scope >= frozenset(GATE_ORDER)
        self.signals = tuple(i for i, signal in enumerate(GATE_ORDER) if signal in rule.scope)


def carries(signals: tuple[int, ...], pod: PodView, ctx: Context, carried: list[int]) -> bool:
    """Does the pod carry one of `signals`? Each signal's predicate is asked at most once per evaluation."""
    for i in signals:
        found = carried[i]
        if found == NOT_ASKED:
            found = carried[i] = CARRIED if _PREDICATES[i](pod, ctx) else ABSENT
        if found == CARRIED:
            return True
    return False


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
        self._gated = tuple(Gated(r) for r in self.rules)
        self._gated_mutating = tuple(g for g in self._gated if g.rule.mutating)
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
        # The scope gate: a rule runs only on a pod carrying a signal of its SCOPE. Outside it a rule reports
        # nothing and changes nothing (the rules' contract, tests/property/test_match_conditions.py), which is also
        # why the API server is told not to send such pods at all (the matchConditions); most pods of a cluster
        # carry none, and are answered after a few reads of their spec instead of every rule's walk.
        carried = [NOT_ASKED] * len(GATE_ORDER)
        asking = AskingRule()
        token = ASKING_RULE.set(asking)
        try:
            for gated in self._gated_mutating if mutating_only else self._gated:
                rule = gated.rule
                asking.rule = rule.id
                try:
                    if gated.always or carries(gated.signals, pod, ctx, carried):
                        findings.extend(rule.check(pod, ctx))
                except Exception as error:  # a rule bug must become a decision, never a 500 traceback
                    raise RuleCrashed(rule, error) from error
        finally:
            ASKING_RULE.reset(token)
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
