"""Numeric settings from the environment, with an error that names the variable."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

Number = TypeVar("Number", int, float)


def env_number(name: str, default: Number, kind: Callable[[str], Number], *, minimum: Number,
               minimum_allowed: bool = True) -> Number:
    """$name parsed with `kind` (int or float), `default` when unset or blank; a value that does not
    parse or is below `minimum` (or equal to it, when `minimum_allowed` is false) raises ValueError."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    noun = "an integer" if kind is int else "a number"
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"${name} must be {noun}, got {raw!r}") from None
    if value < minimum or (value == minimum and not minimum_allowed):
        bound = f">= {minimum}" if minimum_allowed else f"> {minimum}"
        raise ValueError(f"${name} must be {noun} {bound}, got {raw!r}")
    return value
