"""The review path runs compiled (webhook/setup.py: mypyc), as `make` installs it and the image ships it.

A module dropped from the build, or a build that fell back to plain Python, would still pass every other
test and only show as a slower webhook in `make bench`; these tests say so at once. Run against the build
made with GPU_STACK_WEBHOOK_PURE_PYTHON=1 (for a debugger or a line profiler; `make test-interpreted` runs
these and the policy and admission tests on it, with that variable set), they check the opposite: every
module is the interpreted one.

Every build records the digest of its sources (build_source.py), which tests/conftest.py compares with the
checkout before a session starts; the last tests here hold the record and the digest to that.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import json
import os
import shutil
from pathlib import Path

import pytest
from gpu_stack_webhook import build_source

from .recordlib import REPO_ROOT

SETUP = REPO_ROOT / "webhook" / "setup.py"
PACKAGE_ROOT = REPO_ROOT / "webhook" / "src" / "gpu_stack_webhook"


def compiled_paths() -> list[str]:
    """setup.py's COMPILED list (read without running setup()) and every rule module (its RULE_MODULES)."""
    rules = [f"policy/rules/{p.name}" for p in sorted((PACKAGE_ROOT / "policy" / "rules").glob("*.py"))]
    for node in ast.parse(SETUP.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "COMPILED" for t in node.targets):
            return [*ast.literal_eval(node.value), *rules]
    raise AssertionError("webhook/setup.py has no COMPILED list")


def module_name(path: str) -> str:
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["gpu_stack_webhook", *parts])


INTERPRETED = os.environ.get("GPU_STACK_WEBHOOK_PURE_PYTHON") == "1"


def test_every_compiled_path_is_a_module_of_the_package() -> None:
    paths = compiled_paths()
    assert paths and len(set(paths)) == len(paths)
    assert [p for p in paths if not (PACKAGE_ROOT / p).is_file()] == []


@pytest.mark.parametrize("path", compiled_paths())
def test_the_installed_module_is_of_the_build_asked_for(path: str) -> None:
    module = importlib.import_module(module_name(path))
    assert module.__file__ is not None
    if INTERPRETED:
        assert module.__file__.endswith(".py"), module.__file__
    else:
        assert module.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), module.__file__


def test_the_request_path_is_all_compiled() -> None:
    """Every module a review runs (the rule modules join the build by being in policy/rules/: setup.py
    RULE_MODULES; the test above checks each is installed compiled)."""
    paths = set(compiled_paths())
    review_path = {"admission/decide.py", "admission/review.py", "policy/context.py", "policy/desired.py",
                   "policy/dra.py", "policy/engine.py", "policy/gpus.py", "policy/pod.py", "policy/sharing.py",
                   "policy/signals.py", "server/metric_values.py", "server/metrics.py", "server/review_routes.py"}
    assert sorted(review_path - paths) == []


def test_the_installed_build_records_the_sources_of_this_checkout() -> None:
    assert build_source.__file__ is not None
    record = json.loads(Path(build_source.__file__).with_name(build_source.BUILD_RECORD).read_text())
    assert record == {"sources_sha256": build_source.source_digest(REPO_ROOT / "webhook"),
                      "compiled": not INTERPRETED}


def test_the_source_digest_changes_with_any_file_a_build_reads(tmp_path: Path) -> None:
    webhook = tmp_path / "webhook"
    shutil.copytree(REPO_ROOT / "webhook" / "src" / "gpu_stack_webhook", webhook / "src" / "gpu_stack_webhook",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "pyproject.toml"):
        shutil.copy(REPO_ROOT / "webhook" / name, webhook / name)
    original = build_source.source_digest(webhook)
    assert original == build_source.source_digest(REPO_ROOT / "webhook")
    (webhook / "src" / "gpu_stack_webhook" / "policy" / "__pycache__").mkdir()
    (webhook / "src" / "gpu_stack_webhook" / "policy" / "__pycache__" / "pod.cpython-311.pyc").write_bytes(b"x")
    assert build_source.source_digest(webhook) == original, "bytecode is no source"
    changes = [
        webhook / "src" / "gpu_stack_webhook" / "policy" / "quantity.py",
        webhook / "src" / "gpu_stack_webhook" / "gpuinspect" / "inspect-v1.schema.json",
        webhook / "setup.py",
        webhook / "pyproject.toml",
    ]
    for path in changes:
        saved = path.read_bytes()
        path.write_bytes(saved + b"\n")
        assert build_source.source_digest(webhook) != original, path
        path.write_bytes(saved)
    assert build_source.source_digest(webhook) == original
    (webhook / "src" / "gpu_stack_webhook" / "policy" / "new_rule.py").write_text("")
    assert build_source.source_digest(webhook) != original, "a new module"
