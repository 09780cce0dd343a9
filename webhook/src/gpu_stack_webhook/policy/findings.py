"""What a rule reports: a denial, a warning, or a change (a warning saying what it changed in the desired pod)."""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

# One RFC 6902 operation; the engine makes them (policy/desired.py), rules never do.
JsonPatchOp = dict[str, Any]


class Severity(enum.Enum):
    DENY = "deny"
    WARN = "warn"


class Finding(NamedTuple):
    """Immutable and hashable (UPDATE compares the findings of the old object with the new one's); a
    NamedTuple rather than a frozen dataclass because rules build one per finding on the review path."""

    rule_id: str
    severity: Severity
    message: str
    # Field path of the offending value, kubectl style: spec.initContainers[0].env[2]
    path: str = ""
    # The rule changed the desired pod (pod.desired, only for Pods being created) and this warning says what.
    changed: bool = False
    # Kubernetes itself rejects this before the validating webhooks run, so the mutating pass denies it.
    deny_early: bool = False
    # A warning without a change that the mutating pass still reports (e.g. an injection it skipped).
    on_mutate: bool = False

    @property
    def denies(self) -> bool:
        return self.severity is Severity.DENY

    @property
    def text(self) -> str:
        where = f" ({self.path})" if self.path else ""
        return f"{self.rule_id} {self.message}{where}"
