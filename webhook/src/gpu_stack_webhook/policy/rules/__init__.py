"""The policy rules: every module of this package, in ID order (RULES). A rule is one module here, and
nothing else to register: the webhooks, the CEL policies and the matchConditions read RULES, and every list of
rules in the repository (docs, values.schema.json's enum, values.yaml's comments) is written from it by
`make generate` (dev/src/gpu_stack_dev/generate/rule_lists.py).

A rule module is the one place the rule is written: its Python check, its CEL twin, the signals it acts on
and its message texts. The interface, all of it (policy/engine.py runs the checks; cel/ assembles the CEL
policies and the matchConditions from the modules; tests/property holds the two sides to each other):

- `ID` ("GPU009", stable: users disable rules and read audit annotations by it), `NAME` (kebab-case),
  and a docstring whose first line is "ID name: what it enforces" (the summary; the rest says why and
  the exact scope); `DOC`, what it enforces in full for users (markdown, its row of docs/policy-rules.md;
  the summary when left out).
- `SCOPE`, the signals (policy/signals.py) of the requests it can act on: outside them it returns no
  finding and changes nothing, because the API server is told not to call the webhook for such requests
  (the matchConditions are assembled from SCOPE and each signal's CEL); policy/engine.py does not run it on a
  pod carrying none of them.
- `check(pod: PodView, ctx: Context) -> Iterable[Finding]` (the rules here return a list: compiled, a
  list is cheaper to build and read than a generator), pure: no I/O, no clock, no Flask, no
  Kubernetes client (the import contract in `make lint` fails otherwise). Cluster facts come from
  `ctx.facts` when lookups are on. Walk every container with `pod.containers()` (containers,
  initContainers and ephemeralContainers), with the shared helpers of policy/gpus.py (GPU arithmetic)
  and policy/dra.py (DRA claims). For an object that holds no pod (GPU009: ResourceClaim,
  ResourceClaimTemplate; engine.DRA_KINDS), `check_object(obj, kind, desired, ctx)` instead, with
  `check` returning nothing.
- What it checks: `Finding(ID, Severity.DENY | Severity.WARN, message, path)`; `deny_early=True` for
  what Kubernetes would reject before the validating webhooks run (then /mutate denies it too). A
  message the CEL twin gives too is a `cel_twin.Message`: the same template makes the Python text and
  the CEL messageExpression.
- `MUTATING = False` for a rule that never changes the pod and never denies early: /mutate then runs it
  only when another rule denies early (to list every violation), not on every pod (it reports nothing
  the mutating pass keeps). Leave it out when in doubt: a rule runs on both passes by default.
  tests/property checks the claim over generated pods.
- What it changes (only when `ctx.can_patch`: a Pod being created, at /mutate): edit the desired pod and
  report a WARN Finding with `changed=True` saying what changed. `pod.desired.edit(pointer)` returns this
  review's own copy of the object or array at that JSON pointer (`pod.pointer`, `container.pointer`, plus
  "/member"); set, add or delete its members, or edit a deeper pointer first to change inside one.
  Never modify what `pod` shows (it is the request). The engine makes the JSONPatch with jsonpatch from
  the difference; a change must check what is there first, so a reinvoked webhook adds nothing twice.
- Its CEL twin (policy/cel_twin.py): `CEL_VALIDATION`, a ValidatingAdmissionPolicy whose violations are
  the texts of its denials, and/or `CEL_MUTATION`, a MutatingAdmissionPolicy making its changes
  (tests/property/test_cel_equivalence.py compares them with `check` on generated pods); and
  `WEBHOOK_ONLY`, what the twin does not do and why, or why there is no twin. A module without a twin
  must say why (a rule declaring neither fails at import).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from gpu_stack_webhook.policy.cel_twin import CelMutation, CelValidation
from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.desired import DesiredPod
from gpu_stack_webhook.policy.findings import Finding
from gpu_stack_webhook.policy.pod import PodView
from gpu_stack_webhook.policy.signals import Signal

Check = Callable[[PodView, Context], Iterable[Finding]]
# A rule for objects that hold no pod (GPU009: resource.k8s.io claims): (object, kind, desired, ctx).
CheckObject = Callable[[dict[str, Any], str, DesiredPod, Context], Iterable[Finding]]


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    summary: str
    check: Check
    # The requests it can act on (module SCOPE): a request carrying none of these is never sent to it (the default,
    # every signal: sent every request).
    scope: frozenset[Signal] = frozenset(Signal)
    # It may change the pod or deny early (module MUTATING, default True): /mutate runs it on every pod.
    mutating: bool = True
    # Module check_object: judges the DRA objects (engine.DRA_KINDS) instead of a pod spec.
    check_object: CheckObject | None = None
    # Its CEL twin (module CEL_VALIDATION, CEL_MUTATION) and what stays in the webhook (WEBHOOK_ONLY).
    cel_validation: CelValidation | None = None
    cel_mutation: CelMutation | None = None
    webhook_only: str = ""
    # What it enforces, in full (module DOC, markdown): its row of docs/policy-rules.md.
    doc: str = ""


def _rule(module: ModuleType) -> Rule:
    doc = (module.__doc__ or "").strip()
    summary = doc.splitlines()[0].split(": ", 1)[-1] if doc else ""
    rule = Rule(id=module.ID, name=module.NAME, summary=summary, check=module.check,
                scope=frozenset(module.SCOPE), mutating=getattr(module, "MUTATING", True),
                check_object=getattr(module, "check_object", None),
                cel_validation=getattr(module, "CEL_VALIDATION", None),
                cel_mutation=getattr(module, "CEL_MUTATION", None), webhook_only=getattr(module, "WEBHOOK_ONLY", ""),
                doc=getattr(module, "DOC", "") or summary)
    if rule.cel_validation is None and rule.cel_mutation is None and not rule.webhook_only:
        raise ValueError(f"{module.__name__}: a rule has a CEL twin (CEL_VALIDATION, CEL_MUTATION) or says why "
                         "not (WEBHOOK_ONLY)")
    return rule


def _modules() -> list[ModuleType]:
    """Every module of this package (compiled or not), imported at the package's own import."""
    return [importlib.import_module(f"{__name__}.{info.name}")
            for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_")]


# Every module of this package is a rule: RULES in ID order (the order the rules run and are listed in).
RULES: tuple[Rule, ...] = tuple(sorted((_rule(m) for m in _modules()), key=lambda rule: rule.id))
RULE_IDS: frozenset[str] = frozenset(r.id for r in RULES)


def webhook_rules(mutating: bool) -> tuple[Rule, ...]:
    """The rules a webhook runs before the config disables any: /mutate the mutating ones, /validate all."""
    return tuple(rule for rule in RULES if rule.mutating or not mutating)
