"""Reading the fields of API objects as inspect does: what is missing or malformed counts as absent (0 for
a quantity), never as an error; the objects are what the API server or a test fixture holds."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from gpu_stack_webhook.policy.quantity import parse_quantity


def as_int(value: Any) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(Decimal(str(value)))
    except (InvalidOperation, ValueError):
        return None


def as_quantity(value: Any) -> int:
    try:
        return int(parse_quantity(value))
    except (ValueError, TypeError, ArithmeticError):
        return 0


def as_dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}
