"""What a rule reports: a denial, a warning, or a change (a warning that carries JSONPatch ops)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

JsonPatchOp = dict[str, Any]


class Severity(enum.Enum):
    DENY = "deny"
    WARN = "warn"


@dataclass(frozen=True, slots=True)
class Finding:
    rule_id: str
    severity: Severity
    message: str
    # Field path of the offending value, kubectl style: spec.initContainers[0].env[2]
    path: str = ""
    # JSONPatch ops (RFC 6902, pointers escaped) for a change; only ever produced for Pods being created.
    patch: tuple[JsonPatchOp, ...] = field(default=(), compare=False)
    # Kubernetes itself rejects this before the validating webhooks run, so the mutating pass denies it.
    deny_early: bool = field(default=False, compare=False)
    # A warning without a patch that the mutating pass still reports (e.g. an injection it skipped).
    on_mutate: bool = field(default=False, compare=False)

    @property
    def denies(self) -> bool:
        return self.severity is Severity.DENY

    @property
    def text(self) -> str:
        where = f" ({self.path})" if self.path else ""
        return f"{self.rule_id} {self.message}{where}"
