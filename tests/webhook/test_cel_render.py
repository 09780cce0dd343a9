"""cel/render.py derives each validating policy's oldObject variables by renaming identifiers in the CEL
source: `object` becomes `oldObject` and `variables.x` becomes `variables.oldX`, never inside a string
literal and never a field that happens to be called `object` or a `variables` that is itself a field."""

from __future__ import annotations

import pytest
from gpu_stack_webhook.cel import validating
from gpu_stack_webhook.cel.render import _on_old_object, policy_variables, rename_identifiers, tokens

OLD = {"roots": {"object": "oldObject"}, "variables": {"containers": "oldContainers"}}


@pytest.mark.parametrize(("source", "expected"), [
    ("object.spec", "oldObject.spec"),
    ("object . spec", "oldObject . spec"),
    ("size(object.spec.containers) + variables.containers",
     "size(oldObject.spec.containers) + variables.oldContainers"),
    # a field named object, alone or after whitespace
    ("variables.ref.object + object.object", "variables.ref.object + oldObject.object"),
    ("x. object", "x. object"),
    # string literals of every form keep their text
    ("object.metadata.?annotations['object'].orValue('')", "oldObject.metadata.?annotations['object'].orValue('')"),
    ('"an object" + object.kind', '"an object" + oldObject.kind'),
    ("'it\\'s object' + object.kind", "'it\\'s object' + oldObject.kind"),
    ("r'object\\' + object.kind", "r'object\\' + oldObject.kind"),
    ("'''object ' object''' + object.kind", "'''object ' object''' + oldObject.kind"),
    ("b\"object\" == object.raw", "b\"object\" == oldObject.raw"),
    ("'variables.containers' + variables.containers", "'variables.containers' + variables.oldContainers"),
    # names that only contain the word, and a `variables` that is a field
    ("objects + my_object + objectMeta + oldObject", "objects + my_object + objectMeta + oldObject"),
    ("x.variables.containers + variables.podSpec", "x.variables.containers + variables.podSpec"),
    ("1.5e3 + 0x1Fu + object.n", "1.5e3 + 0x1Fu + oldObject.n"),
])
def test_only_the_identifiers_are_renamed(source: str, expected: str) -> None:
    assert rename_identifiers(source, **OLD) == expected  # type: ignore[arg-type]
    assert "".join(tokens(source)) == source


def test_an_unterminated_string_is_an_error_not_a_guess() -> None:
    with pytest.raises(ValueError, match="unterminated string literal"):
        rename_identifiers("object.name == 'object", roots={"object": "oldObject"})


def test_old_object_variables_of_every_policy_read_only_the_old_object() -> None:
    """No generated oldObject variable reads `object` or a variable of the new object (config variables
    are the same for both)."""
    checked = 0
    for policy in validating.POLICIES:
        for name, expression in policy_variables(policy):
            if not name.startswith("old"):
                continue
            source = [t for t in tokens(expression) if not t.isspace()]
            assert "object" not in source, (policy.rule_id, name)
            reads = {source[i + 2] for i in range(len(source) - 2)
                     if source[i] == "variables" and source[i + 1] == "." and (i == 0 or source[i - 1] != ".")}
            assert all(r.startswith("old") or r in policy.config for r in reads), (policy.rule_id, name, reads)
            checked += 1
    assert checked >= len(validating.POLICIES)


def test_on_old_object_renames_the_variables_it_is_given() -> None:
    assert _on_old_object((("a", "object.x + variables.a + variables.b"),), {"a"}) == (
        ("oldA", "oldObject.x + variables.oldA + variables.b"),)
