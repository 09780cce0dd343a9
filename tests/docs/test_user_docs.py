"""What a user reads points at nothing they cannot see: no tracker numbers ("issue 14") and no paths outside
a clone of the repository (`../shared/...`); the README's overlay table lists every overlay as the overlay
describes itself (gpu_stack_dev.generate.overlay_table), and a stated number of overlays is right."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gpu_stack_dev.generate import overlay_table

from .doccommands import CHART, ROOT, documents, rendered_notes

USER_FILES = sorted({*documents(), ROOT / "SECURITY.md", ROOT / "CHANGELOG.md", ROOT / "BENCHMARKS.md",
                     CHART / "values.yaml", CHART / "values.schema.json", CHART / "Chart.yaml",
                     *(CHART / "examples").glob("*.yaml")})
TRACKER = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
OUTSIDE = re.compile(r"\.\./shared\b")


def offending_lines(text: str, pattern: re.Pattern[str]) -> list[tuple[int, str]]:
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if pattern.search(line)]


@pytest.mark.parametrize("path", USER_FILES, ids=[p.relative_to(ROOT).as_posix() for p in USER_FILES])
def test_no_tracker_numbers_or_outside_paths(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    found = [f"{path.relative_to(ROOT)}:{n}: {line}" for pattern in (TRACKER, OUTSIDE)
             for n, line in offending_lines(text, pattern)]
    assert found == [], "\n".join(found)


def test_the_rendered_notes_have_none_either() -> None:
    notes = rendered_notes()
    assert offending_lines(notes, TRACKER) == [] and offending_lines(notes, OUTSIDE) == []


def test_the_patterns_catch_what_they_are_for() -> None:
    assert offending_lines("see issue 14's targets\nIssue #3\nfine", TRACKER) == [(1, "see issue 14's targets"),
                                                                                 (2, "Issue #3")]
    assert offending_lines("copied from ../shared/fixtures/x", OUTSIDE) == [(1, "copied from ../shared/fixtures/x")]


def test_the_overlay_table_has_a_row_per_overlay() -> None:
    rows = overlay_table.table(overlay_table.overlays()).splitlines()[2:]
    assert [row.split("`")[1] for row in rows] == sorted(p.name for p in (CHART / "examples").glob("*.yaml"))


NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"]
OVERLAY_COUNT = re.compile(rf"\b(\d+|{'|'.join(NUMBER_WORDS)})\s+(?:values\s+)?overlays\b", re.IGNORECASE)


def overlay_counts(text: str) -> list[int]:
    """Every "N overlays" a text states, as a number."""
    return [int(n) if n.isdigit() else NUMBER_WORDS.index(n.lower()) for n in OVERLAY_COUNT.findall(text)]


def test_a_stated_number_of_overlays_is_the_number_there_is() -> None:
    """Better no count at all ("every overlay"); one that is written must be right."""
    there_are = len(list((CHART / "examples").glob("*.yaml")))
    wrong = [f"{path.relative_to(ROOT)}: {count}" for path in USER_FILES
             for count in overlay_counts(path.read_text(encoding="utf-8")) if count != there_are]
    assert wrong == [], f"{there_are} overlays in charts/gpu-stack/examples, but:\n" + "\n".join(wrong)


def test_overlay_counts_are_read_as_written() -> None:
    assert overlay_counts("each of the 12 overlays; Twelve values\noverlays; the DRA overlays 1.34") == [12, 12]


def test_an_overlay_without_its_summary_line_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("# something else\nsharing: {}\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="the first line must be '# Overlay: <what you get>'"):
        overlay_table.read(bad)


def test_the_documented_overlay_path_is_the_packaged_one() -> None:
    """`-f Chart-values-examples/X.yaml` (README) and the chart's own examples/ are one directory."""
    assert (ROOT / "Chart-values-examples").resolve() == (CHART / "examples").resolve()


# Pages another branch adds; listed so the link to them can go in first. An entry for a page that exists
# fails test_pages_still_awaited_are_missing: remove it then.
AWAITED: set[str] = set()
LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors: headings lower-cased, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#")}


def _shown(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def broken_links(path: Path) -> list[str]:
    broken = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for link in LINK.findall(line):
            if link.startswith(("http://", "https://", "mailto:")):
                continue
            target, _, anchor = link.partition("#")
            resolved = (path.parent / target).resolve() if target else path
            if not resolved.exists():
                if _shown(resolved) not in AWAITED:
                    broken.append(f"{_shown(path)}:{number}: {link} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved):
                broken.append(f"{_shown(path)}:{number}: {link} (no such heading)")
    return broken


MARKDOWN = sorted(p for p in USER_FILES if p.suffix == ".md")


@pytest.mark.parametrize("path", MARKDOWN, ids=[p.relative_to(ROOT).as_posix() for p in MARKDOWN])
def test_links_point_at_files_and_headings_that_exist(path: Path) -> None:
    assert broken_links(path) == []


def test_pages_still_awaited_are_missing() -> None:
    assert [page for page in AWAITED if (ROOT / page).exists()] == []


def test_a_broken_link_is_reported_with_its_line(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    tls = ROOT / "docs" / "tls.md"
    page.write_text(f"# Page\n\n[ok]({tls}#tls-and-cluster-access) [web](https://example.com)\n"
                    f"[gone](missing.md)\n[heading]({tls}#no-such-heading) [here](#page)\n", encoding="utf-8")
    assert broken_links(page) == [f"{page}:4: missing.md (no such file)",
                                  f"{page}:5: {tls}#no-such-heading (no such heading)"]
