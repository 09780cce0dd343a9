"""Every generated file of the repository, each with the function that renders it: `make generate` rewrites
them all (`python -m gpu_stack_dev.generate`), `--check` lists the stale ones, and tests/test_generated.py
fails naming a stale file.

A generated file is either whole (`render()` gives its content) or one marked section of a hand-written
file (a README table: `render(text)` gives the file with that section made anew, paths.with_section).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpu_stack_webhook.cel import match_conditions, render

from gpu_stack_dev import operator_cases
from gpu_stack_dev.generate import (
    cel_table,
    chart_security,
    env_table,
    overlay_table,
    rbac_table,
    rule_lists,
    support_table,
    values_table,
)
from gpu_stack_dev.generate.monitoring import files
from gpu_stack_dev.generate.paths import CHART, COMMAND, ROOT

MONITORING = CHART / "files" / "monitoring"


@dataclass(frozen=True)
class Generated:
    path: Path
    # What it is made from, for a reader of `--list` and of a stale file's message.
    source: str
    # The file's content as it should be, given its current content ("" when it does not exist yet).
    render: Callable[[str], str]
    section: str = ""  # the README section it owns, "" for a whole file

    @property
    def name(self) -> str:
        shown = self.path.relative_to(ROOT).as_posix()
        return f"{shown} ({self.section})" if self.section else shown

    def current(self) -> str:
        return self.path.read_text(encoding="utf-8") if self.path.exists() else ""

    def wanted(self) -> str:
        return self.render(self.current())

    def stale(self) -> bool:
        return self.current() != self.wanted()


def _whole(text: Callable[[], str]) -> Callable[[str], str]:
    return lambda _current: text()


def _monitoring() -> list[Generated]:
    return [Generated(MONITORING / name, f"gpu_stack_dev/generate/monitoring/{source}", _whole(text))
            for name, (source, text) in files.OUTPUTS.items()]


def _rule_lists() -> list[Generated]:
    """The lists of rule IDs in hand-written files (before the chart README's values table, which reads
    values.yaml's comments)."""
    source = "the rule modules (policy/rules/ RULES)"
    return [Generated(rule_lists.SCHEMA, source, rule_lists.schema_enum, "webhook.policy.rules.disabled enum"),
            Generated(ROOT / "docs" / "policy-rules.md", "the rule modules' ID, NAME and DOC", rule_lists.rules_table,
                      rule_lists.RULES_TABLE),
            *(Generated(item.path, source, item.render, item.what) for item in rule_lists.LISTS)]


def generated() -> list[Generated]:
    """Every generated file (or section), in the order `make generate` writes them."""
    chart_readme = CHART / "README.md"
    return [
        *_rule_lists(),
        Generated(CHART / "files" / "cel-policies.yaml", "the rule modules' CEL twins (policy/rules/)",
                  _whole(render.text)),
        Generated(CHART / "files" / "match-conditions.yaml", "the rule modules' SCOPE and policy/signals.py",
                  _whole(match_conditions.text)),
        Generated(ROOT / "docs" / "cel-mode.md", "the rule modules' CEL twins and WEBHOOK_ONLY", cel_table.readme,
                  cel_table.SECTION),
        *_monitoring(),
        Generated(chart_readme, "values.yaml and values.schema.json", values_table.readme, values_table.SECTION),
        Generated(chart_readme, "the chart rendered with every overlay", rbac_table.readme, rbac_table.SECTION),
        Generated(chart_readme, "the chart rendered with every overlay", chart_security.readme,
                  chart_security.SECTION),
        Generated(ROOT / "README.md", "the first lines of each overlay", overlay_table.readme, overlay_table.SECTION),
        Generated(ROOT / "README.md", support_table.SOURCE, support_table.readme, support_table.SECTION),
        Generated(ROOT / "docs" / "kubernetes-versions.md", support_table.SOURCE, support_table.readme,
                  support_table.SECTION),
        Generated(ROOT / "docs" / "operations.md", "webhook settings.py", env_table.readme, env_table.SECTION),
        Generated(ROOT / "docs" / "gpu-operator.md", "gpu_stack_dev/operator_cases.py hand-written expectations",
                  operator_cases.readme, operator_cases.SECTION),
    ]


def leftovers() -> list[Path]:
    """Files in a generated directory that no generator writes."""
    written = {g.path for g in generated()}
    return sorted(p for p in MONITORING.rglob("*") if p.is_file() and p not in written)


def stale_message(name: str) -> str:
    return f"{name} is stale: run {COMMAND}"
