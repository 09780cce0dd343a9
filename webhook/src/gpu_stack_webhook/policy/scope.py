"""Which of the rules' signals (policy/signals.py) a request carries and whether a webhook would be called for
it: the Python twin of the webhook configurations' matchConditions (cel/match_conditions.py), assembled
like them from the rules' SCOPE and the signals' predicates, and compared with them on generated pods.

Not on the review path: the rules gate themselves (each returns nothing outside its SCOPE, which
tests/property/test_match_conditions.py checks); this module answers "would the API server call the
webhook" for tests, `check` and the docs.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.pod import PodView
from gpu_stack_webhook.policy.rules import RULES, Rule, webhook_rules
from gpu_stack_webhook.policy.signals import SIGNALS, Signal


def signals(pod: PodView, ctx: Context) -> frozenset[Signal]:
    """Every signal the pod (or workload's pod template) carries (policy/signals.py's Python predicates)."""
    return frozenset(signal for signal, carried in SIGNALS.items() if carried.python(pod, ctx))


def object_in_scope(kind: str, ctx: Context) -> bool:
    """Would a rule act on a ResourceClaim or ResourceClaimTemplate (Signal.DRA_OBJECT)?"""
    if kind not in ("ResourceClaim", "ResourceClaimTemplate"):
        return False
    return any(Signal.DRA_OBJECT in rule.scope for rule in judging_rules(RULES, ctx))


def judging_rules(rules: Iterable[Rule], ctx: Context) -> tuple[Rule, ...]:
    """The rules a webhook runs: every rule not in the config's rules.disabled."""
    disabled = set(ctx.config.rules.disabled)
    return tuple(rule for rule in rules if rule.id not in disabled)


def in_scope(pod: PodView, ctx: Context, *, mutating: bool) -> bool:
    """Would a rule of this webhook (/mutate: the mutating rules; /validate: all) act on the pod?"""
    rules = judging_rules(webhook_rules(mutating), ctx)
    carried = signals(pod, ctx)
    return any(carried.intersection(rule.scope) for rule in rules)
