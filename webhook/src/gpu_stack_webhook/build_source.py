"""Which sources an installed build was made from.

webhook/setup.py loads this file by path at build time and writes `record(...)` into the built package
as BUILD_RECORD (beside this module): a SHA-256 over the files the build reads (setup.py, pyproject.toml
and every .py, .json and py.typed file of the package) and whether mypyc compiled it. The test session
(tests/conftest.py) compares it with the sources in the checkout and stops at once when they differ, so
a test never runs a build of other sources than the ones it is meant to test. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

BUILD_RECORD = "build-record.json"
PACKAGE = "gpu_stack_webhook"
SUFFIXES = frozenset({".py", ".json", ".typed"})


def source_files(webhook_dir: Path) -> list[Path]:
    """The files of `webhook_dir` (the directory of setup.py) that a build reads, in a fixed order."""
    package = webhook_dir / "src" / PACKAGE
    files = [p for p in package.rglob("*")
             if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts]
    return sorted([webhook_dir / "setup.py", webhook_dir / "pyproject.toml", *files])


def source_digest(webhook_dir: Path) -> str:
    """SHA-256 over each source file's path (relative to `webhook_dir`), length and bytes."""
    digest = hashlib.sha256()
    for path in source_files(webhook_dir):
        data = path.read_bytes()
        digest.update(f"{path.relative_to(webhook_dir).as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def record(webhook_dir: Path, *, compiled: bool) -> str:
    """The BUILD_RECORD text for a build of `webhook_dir`."""
    return json.dumps({"sources_sha256": source_digest(webhook_dir), "compiled": compiled}, indent=1) + "\n"

