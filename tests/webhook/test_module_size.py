"""Every module of the webhook package stays small enough to read in one sitting: at most 350 lines. A module
that grows past it is split by what it does (as gpuinspect/ is: fetch, model, dra, dashboards, render)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .recordlib import REPO_ROOT

PACKAGE_ROOT = REPO_ROOT / "webhook" / "src" / "gpu_stack_webhook"
MAX_LINES = 350


@pytest.mark.parametrize("path", sorted(PACKAGE_ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE_ROOT)))
def test_module_is_at_most_350_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE_ROOT)}: {lines} lines"
