"""Kubernetes resource quantities ("1", "500m", "2k", "1Gi") as exact decimals, for the policy layer.

The same parse as the `kubernetes` Python client's `kubernetes.utils.quantity.parse_quantity` (v37),
which the policy used before: the policy layer must not import the Kubernetes client (importing any
`kubernetes.*` module imports `kubernetes.client`, ~18 MB resident per process and ~0.2 s of start-up).
tests/webhook/test_quantity.py holds the two to the same answers, byte for byte, on generated input.
"""

from __future__ import annotations

from decimal import Decimal

# Suffix -> power of the base (1000, or 1024 with a trailing "i": Ki Mi Gi Ti Pi Ei).
_EXPONENTS = {"n": -3, "u": -2, "m": -1, "K": 1, "k": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}
_BINARY_PREFIXES = frozenset("KMGTPE")


def parse_quantity(value: object) -> Decimal:
    """The quantity as a Decimal. Raises ValueError or decimal.DecimalException (an ArithmeticError)
    when it is not one. Like the client's parser it takes Python's decimal spellings for the number
    ("1e3", "Infinity"); callers that need a finite number check for it."""
    if isinstance(value, int | float | Decimal):
        return Decimal(value)
    text = str(value)
    if len(text) >= 2 and text[-1] == "i" and text[-2] in _EXPONENTS:
        if text[-2] not in _BINARY_PREFIXES:  # "ki", "mi", "ni", "ui" are no binary suffixes
            raise ValueError(f"{text} has an unknown suffix")
        number, exponent, base = text[:-2], _EXPONENTS[text[-2]], 1024
    elif text and text[-1] in _EXPONENTS:
        number, exponent, base = text[:-1], _EXPONENTS[text[-1]], 1000
    else:
        return Decimal(text)
    return Decimal(number) * (base ** Decimal(exponent))
