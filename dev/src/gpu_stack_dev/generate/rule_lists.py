"""Every list of rules, written from the registry (webhook/src/gpu_stack_webhook/policy/rules/, RULES): the
`webhook.policy.rules.disabled` enum of values.schema.json and the lists of rule IDs in the docs and in
values.yaml's comments (`make generate`).

A list in prose is the run of IDs (`GPU001, GPU002`) that follows a fixed text, its anchor, which occurs
once in its file: the prose around it is hand-written, the IDs are not.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpu_stack_webhook.policy.rules import RULES, Rule

from gpu_stack_dev.generate.paths import CHART, ROOT, with_section

RULES_DIR = ROOT / "webhook" / "src" / "gpu_stack_webhook" / "policy" / "rules"
SCHEMA = CHART / "values.schema.json"
IDS = re.compile(r"GPU\d{3}(?:, GPU\d{3})*")


# --- the lists written from the registry ---------------------------------------------------------------------

def _uses(rule: Rule, name: str) -> bool:
    """Whether the rule's module (its source: the installed one may be compiled) names `name`."""
    source = RULES_DIR / f"{rule.check.__module__.rpartition('.')[2]}.py"
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(ast.parse(source.read_text("utf-8"))))


def cel_validated() -> list[str]:
    return [r.id for r in RULES if r.cel_validation is not None]


def not_cel_validated() -> list[str]:
    return [r.id for r in RULES if r.cel_validation is None]


def mutating() -> list[str]:
    return [r.id for r in RULES if r.mutating]


def unresolved_claims() -> list[str]:
    """The rules that call policy/dra.py unresolved_claims: the claims the webhook cannot read."""
    return [r.id for r in RULES if _uses(r, "unresolved_claims")]


def all_ids() -> list[str]:
    return [r.id for r in RULES]


def schema_enum(text: str) -> str:
    """values.schema.json with `webhook.policy.rules.disabled`'s enum the rule IDs (the only enum of IDs)."""
    pattern = re.compile(r'"enum": \["GPU\d{3}"(?:, "GPU\d{3}")*\]')
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"{SCHEMA.relative_to(ROOT)}: expected one enum of rule IDs")
    return pattern.sub(lambda _m: '"enum": [' + ", ".join(f'"{i}"' for i in all_ids()) + "]", text)


RULES_TABLE = "rules-table"


def rules_table(text: str) -> str:
    """docs/policy-rules.md with its table of rules made from the modules (ID, NAME, DOC)."""
    rows = ["| ID | Name | What it enforces |", "|---|---|---|"]
    rows += [f"| {r.id} | {r.name} | {r.doc.replace('|', chr(92) + '|')} |" for r in RULES]
    return with_section(text, RULES_TABLE, "\n".join(rows) + "\n")


@dataclass(frozen=True)
class IdList:
    path: Path
    # The text right before the list; it occurs once in the file.
    anchor: str
    ids: Callable[[], list[str]]
    what: str  # which rules, for the staleness message

    def render(self, text: str) -> str:
        where = f"{self.path.relative_to(ROOT)}"
        if text.count(self.anchor) != 1:
            raise ValueError(f"{where}: expected the text {self.anchor!r} once, before the list of {self.what}")
        head, tail = text.split(self.anchor, 1)
        match = IDS.match(tail)
        if match is None:
            raise ValueError(f"{where}: expected a list of rule IDs (GPU001, GPU002) after {self.anchor!r}")
        return f"{head}{self.anchor}{', '.join(self.ids())}{tail[match.end():]}"


VALIDATED = "the rules with a ValidatingAdmissionPolicy"
NOT_VALIDATED = "the rules without a ValidatingAdmissionPolicy"
UNRESOLVED = "the rules that follow dra.unresolvedClaims"
MUTATING = "the rules /mutate runs on every pod"

LISTS = (
    # (An anchor may span lines: the list then starts a line of its own.)
    IdList(ROOT / "README.md", "The rules that CEL can express (", cel_validated, VALIDATED),
    IdList(ROOT / "README.md", "The denials of the other rules (", not_cel_validated, NOT_VALIDATED),
    IdList(ROOT / "SECURITY.md", "[docs/cel-mode.md](docs/cel-mode.md): ", cel_validated, VALIDATED),
    IdList(ROOT / "docs" / "cel-mode.md", "| ValidatingAdmissionPolicies for ", cel_validated, VALIDATED),
    IdList(ROOT / "docs" / "cel-mode.md", "the denials of the rules without one (", not_cel_validated, NOT_VALIDATED),
    IdList(ROOT / "docs" / "dra.md", "rules reading claims (", unresolved_claims, UNRESOLVED),
    IdList(ROOT / "docs" / "policy-rules.md", "so it runs the rules that can make them (", mutating, MUTATING),
    IdList(CHART / "README.md", "ValidatingAdmissionPolicy per rule CEL expresses (", cel_validated, VALIDATED),
    IdList(CHART / "templates" / "NOTES.txt", "(both modes cel): the denials of ", not_cel_validated, NOT_VALIDATED),
    IdList(CHART / "values.yaml", "inside the API server for ", cel_validated, VALIDATED),
    IdList(CHART / "values.yaml", "# the denials of ", not_cel_validated, NOT_VALIDATED),
    IdList(CHART / "values.yaml", "in the rules reading claims\n      # (", unresolved_claims, UNRESOLVED),
)
