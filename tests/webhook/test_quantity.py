"""The policy's quantity parser answers exactly what the `kubernetes` client's parser answers.

The policy does not use `kubernetes.utils.quantity.parse_quantity` (kubernetes-client/python v37,
kubernetes/utils/quantity.py): importing it pulls in the whole client, which the policy
layer must not import. Its replacement, policy/quantity.py, must not change a verdict: for every input
both raise, or both return the same Decimal with the same digits and exponent (str() equal).
"""

from __future__ import annotations

import sys
from decimal import Decimal

from gpu_stack_webhook.policy.pod import parse_count
from gpu_stack_webhook.policy.quantity import parse_quantity
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity as client_parse_quantity

SUFFIXES = ["", "n", "u", "m", "k", "K", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
            "ki", "mi", "ni", "ui", "i", "Xi", "e3", "E3", "Mi ", " "]
NUMBERS = ["0", "1", "2", "-1", "+3", "1.5", ".5", "5.", "1e3", "1E-2", "1_000", " 1", "Infinity", "-inf", "NaN",
           "sNaN", "", "0x10", "1e999999999999999999", "1e-999999999999999999", "٣"]


def _outcome(parse: object, value: object) -> tuple[str, str]:
    try:
        return "value", str(parse(value))  # type: ignore[operator]
    except (ValueError, ArithmeticError) as error:
        return "error", type(error).__name__ if not isinstance(error, ValueError) else "ValueError"


def _same(value: object) -> None:
    ours, theirs = _outcome(parse_quantity, value), _outcome(client_parse_quantity, value)
    # The client turns a DecimalException of its own arithmetic into ValueError; ours lets it through
    # (parse_count catches both): only "value" vs "error" and the value itself must agree.
    assert ours[0] == theirs[0], (value, ours, theirs)
    if ours[0] == "value":
        assert ours[1] == theirs[1], (value, ours, theirs)


def test_every_listed_number_and_suffix_parses_the_same() -> None:
    for number in NUMBERS:
        for suffix in SUFFIXES:
            _same(number + suffix)
    for value in (0, 7, -2, 1.5, float("inf"), Decimal("2.50"), sys.maxsize * 10):
        _same(value)


@given(st.text(alphabet="0123456789.+-eEinkKmMGTPuaIfN _", max_size=12))
def test_any_short_string_of_quantity_characters_parses_the_same(text: str) -> None:
    _same(text)


@given(st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=8)))
def test_any_json_scalar_parses_the_same(value: object) -> None:
    _same(value)


def test_the_counts_rules_read() -> None:
    assert parse_count("1") == 1
    assert parse_count("2k") == 2000
    assert parse_count("1Ki") == 1024
    assert parse_count("500m") == Decimal("0.5")
    assert parse_count("1.5") == Decimal("1.5")
    for bad in ("Infinity", "NaN", "1ki", "abc", "", None, True, [1]):
        assert parse_count(bad) is None, bad
