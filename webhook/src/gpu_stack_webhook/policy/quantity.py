"""Kubernetes resource quantities ("1", "500m", "2Ki", "1e3") as Decimals, without the Kubernetes client.

The policy core is pure and imports no Kubernetes client (the import contract), so it reads quantities
itself, exactly as the client's `kubernetes.utils.quantity.parse_quantity` does (tests/webhook/
test_quantity.py compares the two): a number `Decimal` accepts, then at most one suffix, binary
(Ki Mi Gi Ti Pi Ei) or decimal (n u m k K M G T P E). Callers reject what Kubernetes would not.
"""

from __future__ import annotations

from decimal import Decimal, DecimalException, InvalidOperation

_EXPONENTS = {"n": -3, "u": -2, "m": -1, "k": 1, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}
_BINARY_PREFIXES = "KMGTPE"


def parse_quantity(quantity: object) -> Decimal:
    """The value of a quantity; raises ValueError when it is none."""
    if isinstance(quantity, int | float | Decimal):
        return Decimal(quantity)
    text = str(quantity)
    number, prefix, base = text, "", 1000
    if len(text) >= 2 and text[-1] == "i" and text[-2] in _EXPONENTS:
        number, prefix, base = text[:-2], text[-2], 1024
        if prefix not in _BINARY_PREFIXES:  # "ki", "mi", "ni", "ui" are not binary suffixes
            raise ValueError(f"{text} has unknown suffix")
    elif text[-1:] in _EXPONENTS:
        number, prefix = text[:-1], text[-1]
    try:
        value = Decimal(number)
    except InvalidOperation:
        raise ValueError(f"Invalid number format: {number}") from None
    if not prefix:
        return value
    try:
        return value * (base ** Decimal(_EXPONENTS[prefix]))
    except DecimalException as error:
        raise ValueError(f"Invalid quantity: {text}") from error
