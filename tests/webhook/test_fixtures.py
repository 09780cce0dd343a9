"""The recorded API-server traffic in tests/fixtures/ lives in the repository, every file pinned by SHA256SUMS
and unchanged."""

from __future__ import annotations

import hashlib

from .recordlib import FIXTURES, REPO_ROOT


def pinned() -> dict[str, str]:
    lines = (FIXTURES / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
    return {name: digest for digest, name in (line.split(maxsplit=1) for line in lines)}


def test_fixtures_live_in_the_repository() -> None:
    # real files inside the checkout, not a link to a directory outside it
    assert not FIXTURES.is_symlink() and FIXTURES.resolve().is_relative_to(REPO_ROOT.resolve())
    assert sum(1 for p in FIXTURES.rglob("*.json") if p.is_file() and not p.is_symlink()) > 0


def test_every_copied_file_is_pinned_and_unchanged() -> None:
    sums = pinned()
    files = {p.relative_to(FIXTURES).as_posix() for p in FIXTURES.rglob("*") if p.is_file()} - {"SHA256SUMS"}
    assert files == set(sums)
    for name, digest in sums.items():
        assert hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest() == digest, name
