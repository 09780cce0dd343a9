"""The bypass catalogue's case: an attack and what must come of it (tests/webhook/test_bypass.py runs them).

A rule's own test file (tests/webhook/test_rules_<module>.py) may hold its ways around as `BYPASSES`, a dict
of case name ("gpu012-...") to Attack: test_bypass.py runs them with its own cases.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from .podlib import container, wrap


@dataclass(frozen=True)
class Attack:
    obj: dict[str, Any]
    endpoint: str = "validate"
    allowed: bool = False
    rule: str = ""  # the rule ID the denial must name
    config: str = "default"
    review: dict[str, Any] = field(default_factory=dict)  # admission_review keyword arguments
    patched: bool = False  # /mutate: a patch must come back


def gpu_main(**kw: Any) -> dict[str, Any]:
    return container("main", gpu=1, **kw)


def with_env(*env: dict[str, Any]) -> dict[str, Any]:
    return container("main", env=list(env))


def debug(c: dict[str, Any]) -> dict[str, Any]:
    """An ephemeral container as `kubectl debug` adds it (targetContainerName set)."""
    return {**c, "name": "debugger", "targetContainerName": "main"}


def ephemeral_update(base: dict[str, Any], added: dict[str, Any], **kw: Any) -> Attack:
    """UPDATE pods/ephemeralcontainers (`kubectl debug`): the old pod plus one ephemeral container."""
    new = copy.deepcopy(base)
    new["spec"].setdefault("ephemeralContainers", []).append(added)
    return Attack(new, review={"operation": "UPDATE", "old_object": base, "sub_resource": "ephemeralcontainers"},
                  **kw)


def template_update(kind: str, old_pod: dict[str, Any], new_pod: dict[str, Any], **kw: Any) -> Attack:
    return Attack(wrap(new_pod, kind), review={"operation": "UPDATE", "old_object": wrap(old_pod, kind)}, **kw)
