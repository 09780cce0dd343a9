"""The development machinery is one importable package (gpu_stack_dev, dev/), not files reached by path."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import gpu_stack_dev
import gpu_stack_webhook
from gpu_stack_dev.paths import ROOT

PACKAGE = Path(gpu_stack_dev.__file__).resolve().parent
MAX_LINES = 350
# Where the repository's own Python lives; none of it may reach another file by editing the import path.
PYTHON_TREES = ("tests", "bench", "hack", "dev", "webhook/src")
SYS_PATH_EDIT = re.compile(r"\bsys\.path\.(insert|append|extend)\b|\bsite\.addsitedir\b")


def test_the_package_is_the_checkouts_own() -> None:
    assert PACKAGE == ROOT / "dev" / "src" / "gpu_stack_dev"


def test_every_module_of_the_dev_package_is_at_most_350_lines() -> None:
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
             for p in sorted(PACKAGE.rglob("*.py"))}
    assert len(sizes) > 20
    assert {path: n for path, n in sizes.items() if n > MAX_LINES} == {}


def test_no_python_file_edits_the_import_path() -> None:
    offenders = [f"{p.relative_to(ROOT)}:{n}"
                 for tree in PYTHON_TREES for p in sorted((ROOT / tree).rglob("*.py"))
                 for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
                 if SYS_PATH_EDIT.search(line) and p != Path(__file__).resolve()]
    assert offenders == []


def test_the_webhook_importing_the_dev_package_breaks_the_import_contract(tmp_path: Path) -> None:
    """lint-imports on a copy of the webhook package (first on the path) whose top module imports gpu_stack_dev."""
    copy = tmp_path / "gpu_stack_webhook"
    shutil.copytree(Path(gpu_stack_webhook.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    init = copy / "__init__.py"
    init.write_text("import gpu_stack_dev\n" + init.read_text(encoding="utf-8"), encoding="utf-8")
    result = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache", "--config", str(ROOT / "pyproject.toml")],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, timeout=300,
        check=False)
    assert result.returncode != 0
    assert "The webhook never imports the development machinery BROKEN" in result.stdout, result.stdout
    assert "gpu_stack_webhook -> gpu_stack_dev" in result.stdout
