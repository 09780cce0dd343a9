"""policy.quantity reads a resource quantity exactly as the Kubernetes client's parse_quantity does.

The policy core may not import the Kubernetes client (the import contract), so it carries its own
parser; this compares the two on the spellings GPU resources are written in, odd ones included
(kubernetes python client v37, kubernetes/utils/quantity.py).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from gpu_stack_webhook.policy.quantity import parse_quantity
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity as client_parse_quantity

SPELLINGS = ["1", "0", "-1", "1.5", "1000m", "500m", "2k", "2K", "1Ki", "1Mi", "1Gi", "1Ei", "1ki", "1mi", "1ni",
             "1ui", "1e3", "1E3", "1n", "1u", "1m", "1E", "1P", "1T", "1G", "1M", "inf", "Infinity", "NaN", "-inf",
             "", " 1", "1 ", "i", "Ki", "1.0.0", "0x1", "1_000", "1e400000000000", "1Ei" * 2, 1, 0, 2.5, True,
             Decimal("1.25"), None, [1], "+1", ".5", "5.", "1e-3m"]


def outcome(parse: Any, value: Any) -> Any:
    try:
        result = parse(value)
    except ValueError:
        return "ValueError"
    return ("NaN",) if result.is_nan() else result


@pytest.mark.parametrize("value", SPELLINGS, ids=repr)
def test_same_value_or_same_error_as_the_client(value: Any) -> None:
    assert outcome(parse_quantity, value) == outcome(client_parse_quantity, value)


@given(st.text(alphabet="0123456789.-+eEkKmMGTPEinu ", max_size=8))
def test_same_on_any_short_spelling(text: str) -> None:
    assert outcome(parse_quantity, text) == outcome(client_parse_quantity, text)
