"""The session runs the webhook built from the sources in this checkout, or it does not run.

The webhook is installed as built (mypyc-compiled, `make venv`), not editable, so after a change to
webhook/ a bare `pytest` would test the previous build. The build records a digest of its sources
(webhook/setup.py, gpu_stack_webhook/build_source.py); here it is compared with the checkout's before any
test is collected. Running the sources themselves (PYTHONPATH=webhook/src) needs no record.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

WEBHOOK = Path(__file__).resolve().parents[1] / "webhook"
SOURCE_PACKAGE = WEBHOOK / "src" / "gpu_stack_webhook"


def checkout_build_source() -> ModuleType:
    """The checkout's build_source.py, by path (the installed one may be of other sources)."""
    spec = importlib.util.spec_from_file_location("_checkout_build_source", SOURCE_PACKAGE / "build_source.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stale_build_message() -> str:
    """Why the importable gpu_stack_webhook is not the checkout's sources; "" when it is."""
    spec = importlib.util.find_spec("gpu_stack_webhook")
    if spec is None or not spec.submodule_search_locations:
        return "gpu_stack_webhook is not installed: run `make venv` (it builds webhook/ into .venv)"
    location = Path(next(iter(spec.submodule_search_locations))).resolve()
    if location == SOURCE_PACKAGE.resolve():
        return ""  # the sources themselves, interpreted
    build_source = checkout_build_source()
    record = location / build_source.BUILD_RECORD
    if not record.is_file():
        return (f"the gpu_stack_webhook installed at {location} records no sources (built before build records "
                "existed): run `make venv`, after `rm .venv/.installed` if make finds it up to date")
    built = json.loads(record.read_text(encoding="utf-8"))
    now = build_source.source_digest(WEBHOOK)
    if built["sources_sha256"] != now:
        kind = "compiled" if built["compiled"] else "interpreted"
        return (f"the {kind} gpu_stack_webhook installed at {location} was built from other sources than "
                f"webhook/ holds now (sha256 {built['sources_sha256'][:12]}, now {now[:12]}): rebuild it with "
                "`make venv` (make test, make e2e and make lint do; `make test-interpreted` for the interpreted "
                "build), or test the sources themselves with PYTHONPATH=webhook/src")
    return ""


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller checked already
        return
    message = stale_build_message()
    if message:
        raise pytest.UsageError(f"gpu-stack: {message}")
