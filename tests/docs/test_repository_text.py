"""What the repository says about itself holds: no text in it names a number of our tracker ("issue 14's
targets": a reader outside the tracker learns nothing from it; say what is measured or checked instead), and
every file (and `file.py::test_name`) a Markdown file cites exists."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

from .doccommands import ROOT
from .test_user_docs import TRACKER, offending_lines

# These two show the patterns they look for.
PATTERN_EXAMPLES = {"tests/docs/test_user_docs.py", "tests/docs/test_repository_text.py"}
# Paths a Markdown file may cite that are not in the tree, each with why.
NOT_IN_THE_TREE = {
    "webhook/src/gpu_stack_webhook/policy/rules/host_devices.py": "CONTRIBUTING's worked example: a rule to write",
    "tests/webhook/test_rules_host_devices.py": "CONTRIBUTING's worked example: its tests",
    "bench/analysis.md": "in the git history only, named in BENCHMARKS.md's `git log` command",
    "docs/metrics/workload/pod-metrics.md": "kube-state-metrics' file, cited by tests/fixtures/metric-names",
    "docs/metrics/cluster/node-metrics.md": "kube-state-metrics' file, cited by tests/fixtures/metric-names",
}
# A repository path in Markdown: not part of a longer path (`/dev/null`, `templates/webhook/...` of the chart
# README), not a pattern (`test_*.py`, `<overlay>`), optionally `::name` of a test or function in it.
CITED = re.compile(r"(?<![\w./-])((?:bench|charts|dev|docs|hack|tests|webhook)/[\w./-]*[\w/])(?![\w*<{-])"
                   r"(?:::(\w+))?")


@cache
def tracked() -> tuple[str, ...]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], check=True, capture_output=True).stdout
    return tuple(sorted(name for name in out.decode().split("\0") if name))


def text_of(name: str) -> str | None:
    """The file's text, None for a binary file or one the checkout lacks (a symlink's target, LFS)."""
    path = ROOT / name
    if not path.is_file():
        return None
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def tracker_numbers(name: str) -> list[str]:
    text = text_of(name)
    return [] if text is None else [f"{name}:{n}: {line}" for n, line in offending_lines(text, TRACKER)]


def test_no_file_names_a_tracker_number() -> None:
    found = [hit for name in tracked() if name not in PATTERN_EXAMPLES
             for hit in tracker_numbers(name)]
    assert found == [], "\n".join(found)


def missing_citations(path: Path) -> list[str]:
    shown = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    missing = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for cited, name in CITED.findall(line):
            target = ROOT / cited
            if cited.rstrip("/") in NOT_IN_THE_TREE:
                continue
            if not target.exists():
                missing.append(f"{shown}:{number}: {cited} (no such file)")
            elif name and not re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b",
                                        target.read_text(encoding="utf-8"), re.MULTILINE):
                missing.append(f"{shown}:{number}: {cited}::{name} (no such function or class)")
    return missing


MARKDOWN = [name for name in tracked() if name.endswith(".md")]


@pytest.mark.parametrize("name", MARKDOWN)
def test_cited_files_and_tests_exist(name: str) -> None:
    assert missing_citations(ROOT / name) == []


def test_the_citation_check_catches_what_it_is_for(tmp_path: Path) -> None:
    page = tmp_path / "README.md"
    page.write_text("tests/deviceplugin/test_stubs.py checks it; /dev/null, tests/e2e/node/test_*.py and\n"
                    "tests/deviceplugin/test_standin.py::test_stubs_come_from_the_upstream_proto are fine;\n"
                    "tests/deviceplugin/test_standin.py::test_gone is not\n", encoding="utf-8")
    assert missing_citations(page) == [
        f"{page}:1: tests/deviceplugin/test_stubs.py (no such file)",
        f"{page}:3: tests/deviceplugin/test_standin.py::test_gone (no such function or class)"]


def test_not_in_the_tree_is_not_in_the_tree() -> None:
    assert [name for name in NOT_IN_THE_TREE if (ROOT / name).exists()] == []
