"""The package imports itself only at module top: no import of gpu_stack_webhook inside a function or
class body (no cycles, and no late imports to dodge one). ruff's PLC0415 already flags every
function-level import, but a `# noqa` silences it; this test has no such escape for the package's own
modules. Third-party lazy imports (the Kubernetes client for the CLI's start-up) are ruff's to judge."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .recordlib import REPO_ROOT

PACKAGE = "gpu_stack_webhook"
SOURCES = sorted((REPO_ROOT / "webhook" / "src" / PACKAGE).rglob("*.py"))
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
DYNAMIC = {"import_module", "__import__"}


def _is_package(name: str) -> bool:
    return name == PACKAGE or name.startswith(f"{PACKAGE}.")


def late_imports(source: str) -> list[tuple[int, str]]:
    """(line, what) for every import of the package below module level, static or importlib's."""
    found: dict[int, str] = {}
    for scope in ast.walk(ast.parse(source)):
        if not isinstance(scope, SCOPES):
            continue
        for node in ast.walk(scope):
            if node is scope:
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = ["." if node.level else (node.module or "")]  # a relative import is the package's
            elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)
                  and getattr(node.func, "attr", getattr(node.func, "id", None)) in DYNAMIC):
                names = [node.args[0].value]
            else:
                continue
            if any(name == "." or _is_package(name) for name in names):
                found[node.lineno] = ", ".join(names)
    return sorted(found.items())


def test_the_detector_finds_late_imports_of_the_package() -> None:
    source = """
import json
from gpu_stack_webhook.policy import config

def f():
    import os
    from gpu_stack_webhook.server.app import create_app
    import gpu_stack_webhook.cel.check as check
    return importlib.import_module("gpu_stack_webhook.kube.client")

class C:
    from . import settings

    def m(self):
        from kubernetes import client
"""
    assert late_imports(source) == [
        (7, "gpu_stack_webhook.server.app"),
        (8, "gpu_stack_webhook.cel.check"),
        (9, "gpu_stack_webhook.kube.client"),
        (12, "."),
    ]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO_ROOT / "webhook" / "src")))
def test_no_module_imports_the_package_inside_a_function(path: Path) -> None:
    assert late_imports(path.read_text(encoding="utf-8")) == []


def test_every_module_was_checked() -> None:
    assert len(SOURCES) > 40  # the glob did find the package
