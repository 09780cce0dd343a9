"""The recorded API-server traffic in tests/fixtures/ is an unchanged copy of the shared recordings."""

from __future__ import annotations

import hashlib

from recordlib import FIXTURES, REPO_ROOT

SHARED = REPO_ROOT.parent / "shared" / "fixtures" / "apiserver-v1.36"


def pinned() -> dict[str, str]:
    lines = (FIXTURES / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
    return {name: digest for digest, name in (line.split(maxsplit=1) for line in lines)}


def test_fixtures_live_in_the_repository() -> None:
    # real files inside the checkout, not a link out to ../shared
    assert not FIXTURES.is_symlink() and FIXTURES.resolve().is_relative_to(REPO_ROOT.resolve())
    assert sum(1 for p in FIXTURES.rglob("*.json") if p.is_file() and not p.is_symlink()) > 0


def test_every_copied_file_is_pinned_and_unchanged() -> None:
    sums = pinned()
    files = {p.relative_to(FIXTURES).as_posix() for p in FIXTURES.rglob("*") if p.is_file()} - {"SHA256SUMS"}
    assert files == set(sums)
    for name, digest in sums.items():
        assert hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest() == digest, name


def test_copies_equal_the_shared_recordings_where_present() -> None:
    compared = [name for name in pinned() if (SHARED / name).is_file()]
    for name in compared:
        assert (SHARED / name).read_bytes() == (FIXTURES / name).read_bytes(), name
    # Beside a checkout with ../shared every copy has its source; a fresh clone alone compares none.
    assert compared == sorted(pinned()) or not SHARED.is_dir()
