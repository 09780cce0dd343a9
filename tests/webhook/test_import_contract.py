"""The import contract of `make lint` ([tool.importlinter] in pyproject.toml) catches a rule doing I/O.

lint-imports runs on a copy of the package (first on the path, ahead of the installed one): the copy as
it is keeps both contracts; the copy with one rule importing Flask or the Kubernetes client breaks the
policy contract, and the report names the rule module and what it imported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import gpu_stack_webhook
import pytest

REPO_ROOT = Path(__file__).parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
RULE_MODULE = Path("policy", "rules", "runtime_class.py")


def lint_imports(tmp_path: Path, added_import: str | None) -> subprocess.CompletedProcess[str]:
    copy = tmp_path / "gpu_stack_webhook"
    shutil.copytree(Path(gpu_stack_webhook.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    if added_import:
        rule = copy / RULE_MODULE
        rule.write_text(rule.read_text(encoding="utf-8").replace(
            "from __future__ import annotations\n", f"from __future__ import annotations\n\n{added_import}\n", 1),
            encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(REPO_ROOT / "pyproject.toml")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )


def test_the_package_keeps_the_contract(tmp_path: Path) -> None:
    result = lint_imports(tmp_path, None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(("statement", "imported"), [
    ("import flask", "flask"),
    ("from kubernetes import client", "kubernetes"),
])
def test_a_rule_importing_flask_or_the_kubernetes_client_breaks_it(tmp_path: Path, statement: str,
                                                                    imported: str) -> None:
    result = lint_imports(tmp_path, statement)
    assert result.returncode != 0
    assert "5 kept, 1 broken" in result.stdout, result.stdout
    assert f"gpu_stack_webhook.policy is not allowed to import {imported}" in result.stdout
    assert f"gpu_stack_webhook.policy.rules.runtime_class -> {imported}" in result.stdout
