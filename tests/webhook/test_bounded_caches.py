"""Every memo in the webhook package has a bound: a gunicorn worker runs for weeks, and a cache keyed by
what requests or configs bring must not grow with them. `functools.cache`, and `lru_cache` without a
maxsize or with maxsize=None, are unbounded."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .recordlib import REPO_ROOT

PACKAGE_ROOT = REPO_ROOT / "webhook" / "src" / "gpu_stack_webhook"
SOURCES = sorted(PACKAGE_ROOT.rglob("*.py"))


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def unbounded_caches(source: str) -> list[tuple[int, str]]:
    """(line, function) of every function memoized without a bound."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for decorator in node.decorator_list:
            name = _name(decorator)
            if name == "cache":
                found.append((node.lineno, node.name))
            elif name == "lru_cache":
                maxsize = None
                if isinstance(decorator, ast.Call):
                    given = [k.value for k in decorator.keywords if k.arg == "maxsize"] + decorator.args[:1]
                    maxsize = given[0] if given else None
                if maxsize is None or (isinstance(maxsize, ast.Constant) and maxsize.value is None):
                    found.append((node.lineno, node.name))
    return found


def test_the_detector_finds_unbounded_memos() -> None:
    source = """
import functools
from functools import cache, lru_cache

@cache
def a(x): ...

@functools.lru_cache
def b(x): ...

@lru_cache(maxsize=None)
def c(x): ...

@lru_cache()
def d(x): ...

@functools.lru_cache(maxsize=128)
def bounded(x): ...

@lru_cache(16)
def also_bounded(x): ...
"""
    assert unbounded_caches(source) == [(6, "a"), (9, "b"), (12, "c"), (15, "d")]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE_ROOT)))
def test_every_memo_of_the_package_is_bounded(path: Path) -> None:
    assert unbounded_caches(path.read_text(encoding="utf-8")) == []
