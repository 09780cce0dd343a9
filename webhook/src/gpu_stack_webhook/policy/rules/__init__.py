"""The policy rules, listed explicitly. Each module has a stable ID, a NAME, a docstring and `check`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType

from gpu_stack_webhook.policy.findings import Finding
from gpu_stack_webhook.policy.pod import PodView
from gpu_stack_webhook.policy.rules import (
    device_bypass,
    gpu_limits,
    mig_resources,
    mps,
    privileged,
    runtime_class,
    shared_requests,
    visible_devices,
)
from gpu_stack_webhook.policy.rules.base import Context

Check = Callable[[PodView, Context], Iterable[Finding]]


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    summary: str
    check: Check


def _rule(module: ModuleType) -> Rule:
    doc = (module.__doc__ or "").strip()
    summary = doc.splitlines()[0].split(": ", 1)[-1] if doc else ""
    return Rule(id=module.ID, name=module.NAME, summary=summary, check=module.check)


RULES: tuple[Rule, ...] = tuple(
    _rule(m)
    for m in (gpu_limits, visible_devices, privileged, shared_requests, mig_resources, mps, device_bypass,
              runtime_class)
)
RULE_IDS: frozenset[str] = frozenset(r.id for r in RULES)
