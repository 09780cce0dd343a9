"""docs/policy-rules.md names every rule of RULES (policy/rules/__init__.py) with its ID and name, in order,
and lists exactly the rules /mutate runs (the mutating ones: module MUTATING, default True)."""

from __future__ import annotations

import re

from gpu_stack_webhook.policy.rules import RULES

from .doccommands import ROOT

DOC = ROOT / "docs" / "policy-rules.md"
ROW = re.compile(r"^\| (GPU\d{3}) \| ([a-z0-9-]+) \|", re.MULTILINE)
# "... so it runs the rules that can make them (GPU001, GPU006, ...); the others declare ..."
MUTATING_LIST = re.compile(r"runs the rules that can\s+make them \(([^)]*)\)")


def test_the_rules_table_has_every_rule_in_order() -> None:
    assert ROW.findall(DOC.read_text(encoding="utf-8")) == [(rule.id, rule.name) for rule in RULES]


def test_the_mutating_rules_listed_are_those_mutate_runs() -> None:
    [listed] = MUTATING_LIST.findall(DOC.read_text(encoding="utf-8"))
    assert [name.strip() for name in listed.split(",")] == [rule.id for rule in RULES if rule.mutating]
