"""A rule module is the one place its rule is written (policy/rules/__init__.py): its check, its CEL twin or
the reason it has none, and message templates that give the Python text and the CEL expression alike."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
from gpu_stack_webhook.cel import mutating, validating
from gpu_stack_webhook.cel.runtime import evaluate
from gpu_stack_webhook.policy.cel_twin import Literal, Message
from gpu_stack_webhook.policy.rules import RULES, _rule

RULES_DIR = Path(__file__).resolve().parents[2] / "webhook" / "src" / "gpu_stack_webhook" / "policy" / "rules"


def test_a_module_without_a_cel_twin_or_a_reason_is_refused() -> None:
    module = types.ModuleType("gpu_stack_webhook.policy.rules.example")
    module.__doc__ = "GPU099 example: an example."
    module.ID, module.NAME, module.SCOPE = "GPU099", "example", ()
    module.check = lambda pod, ctx: []
    with pytest.raises(ValueError, match=r"rules\.example: a rule has a CEL twin .* or says why not"):
        _rule(module)
    module.WEBHOOK_ONLY = "it needs a lookup"
    assert _rule(module).webhook_only == "it needs a lookup"


def test_every_rule_has_a_twin_or_says_why_not() -> None:
    assert all(r.cel_validation or r.cel_mutation or r.webhook_only for r in RULES)


def test_the_policies_are_the_rule_modules_twins_in_rule_order() -> None:
    assert [p.rule_id for p in validating.POLICIES] == [r.id for r in RULES if r.cel_validation is not None]
    assert [p.rule_id for p in mutating.POLICIES] == [r.id for r in RULES if r.cel_mutation is not None]
    # A twin names its own rule: the policies' names and the denial texts say which rule they are.
    assert all(p.rule_id == r.id and p.name == r.name
               for r in RULES for p in (r.cel_validation, r.cel_mutation) if p is not None)


def test_every_module_of_the_package_is_a_rule_in_id_order() -> None:
    """policy/rules/ is the registry: each of its modules (but `_private` ones) is one rule, nothing to list."""
    modules = sorted(p.stem for p in RULES_DIR.glob("*.py") if not p.name.startswith("_"))
    assert sorted(r.check.__module__.rpartition(".")[2] for r in RULES) == modules
    assert [r.id for r in RULES] == sorted(r.id for r in RULES)


@pytest.mark.parametrize("template", [
    "{label} sets it; {how}",
    "it's {label}'s \"own\" \\ {how}",
    'request "{label}" asks for {how}',
])
def test_a_message_gives_the_same_text_in_python_and_in_cel(template: str) -> None:
    message = Message(template)
    python = message(label="c", how="x'y\"z")
    cel = message.cel(label="variables.label", how="variables.how")
    assert evaluate(cel, None, {"label": "c", "how": "x'y\"z"}) == python


def test_a_literal_field_is_part_of_the_text_around_it() -> None:
    message = Message("{label}: {resource} {kind} {value} is not a whole number")
    assert message.cel(label="a.e.label", resource="a.r", kind=Literal("request"), value="a.req") == (
        "a.e.label + ': ' + a.r + ' request ' + a.req + ' is not a whole number'")
    assert message(label="c", resource="nvidia.com/gpu", kind="request", value="0.5") == (
        "c: nvidia.com/gpu request 0.5 is not a whole number")
