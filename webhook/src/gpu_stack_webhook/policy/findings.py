"""What a rule reports: a denial, a warning, or a change (a warning saying what it changed in the desired pod)."""

from __future__ import annotations

import enum
from typing import Any

# One RFC 6902 operation; the engine makes them (policy/desired.py), rules never do.
JsonPatchOp = dict[str, Any]


class Severity(enum.Enum):
    DENY = "deny"
    WARN = "warn"


class Finding:
    """Immutable by convention and hashable (UPDATE compares the findings of the old object with the new
    one's, all fields counted). A plain slotted class rather than a NamedTuple or a dataclass: compiled
    (webhook/setup.py), rules build one per finding on the review path natively."""

    __slots__ = ("changed", "deny_early", "message", "on_mutate", "path", "rule_id", "severity")

    def __init__(self, rule_id: str, severity: Severity, message: str, path: str = "", *, changed: bool = False,
                 deny_early: bool = False, on_mutate: bool = False) -> None:
        self.rule_id = rule_id
        self.severity = severity
        self.message = message
        # Field path of the offending value, kubectl style: spec.initContainers[0].env[2]
        self.path = path
        # The rule changed the desired pod (pod.desired, only for Pods being created) and this warning says what.
        self.changed = changed
        # Kubernetes itself rejects this before the validating webhooks run, so the mutating pass denies it.
        self.deny_early = deny_early
        # A warning without a change that the mutating pass still reports (e.g. an injection it skipped).
        self.on_mutate = on_mutate

    def _key(self) -> tuple[str, Severity, str, str, bool, bool, bool]:
        return (self.rule_id, self.severity, self.message, self.path, self.changed, self.deny_early, self.on_mutate)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Finding) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        flags = "".join(f", {name}=True" for name in ("changed", "deny_early", "on_mutate") if getattr(self, name))
        return f"Finding({self.rule_id!r}, {self.severity}, {self.message!r}, {self.path!r}{flags})"

    @property
    def denies(self) -> bool:
        return self.severity is Severity.DENY

    @property
    def text(self) -> str:
        where = f" ({self.path})" if self.path else ""
        return f"{self.rule_id} {self.message}{where}"
