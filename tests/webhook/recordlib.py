"""The recorded kube-apiserver v1.36 traffic the webhook tests read (tests/fixtures/README.md).

- `recorded(name)`: one recorded file, parsed JSON for *.json, text otherwise.
- `recorded_names(pattern)` / `recorded_params(pattern)`: the recorded files matching a glob, for parametrizing.

The recordings are part of the repository, so a missing one is an error (the test fails, a parametrized
module fails to collect), never a skip.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).parents[2]
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "apiserver-v1.36"  # copied from ../shared (tests/fixtures/README.md)


def recorded(name: str) -> Any:
    """A recorded file by its path under FIXTURES: parsed JSON for *.json, text otherwise."""
    path = FIXTURES / name
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if path.suffix == ".json" else text


def recorded_names(pattern: str) -> list[str]:
    """Names (relative to FIXTURES) of the recorded files matching a glob; at least one."""
    names = sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.glob(pattern) if p.is_file())
    if not names:
        raise FileNotFoundError(f"no recorded file matches {FIXTURES / pattern} (tests/fixtures/README.md)")
    return names


def recorded_params(pattern: str) -> list[Any]:
    """pytest params over the recorded files matching a glob, one per file (id = file stem)."""
    return [pytest.param(n, id=Path(n).stem) for n in recorded_names(pattern)]
