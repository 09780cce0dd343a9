"""BENCHMARKS.md says where each of its parts comes from: a run keeps nothing of the old file but the
sections other scripts wrote, each stamped with its run; files it includes say which commit they come
from; the blocks at the top (a warning for a run on uncommitted changes, the targets and their verdicts,
the parts and their runs) follow every writer; and the committed file measured committed code. No timing
here."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from gpu_stack_dev.bench import provenance, report
from gpu_stack_dev.paths import BENCH

STAMP = provenance.stamp("make bench", when="2026-11-25 14:00 UTC", at="0123456789ab")
OLD_STAMP = provenance.stamp("make bench", when="2026-11-24 09:00 UTC", at="ba9876543210")


def _new() -> str:
    return "\n".join([*report.frame_lines(), report.HTTP_BEGIN,
                      "## The webhook over TLS (bench/run_bench.py)", "", STAMP, "", "## Headline: the pod mix",
                      "new figures", report.HTTP_END, ""])


def _table(text: str) -> list[str]:
    inside = text.split(report.PARTS_BEGIN, 1)[1].split(report.PARTS_END, 1)[0]
    return [line for line in inside.splitlines() if line.startswith("| ") and not line.startswith("| part ")]


OLD = "\n".join([
    report.TITLE, "", report.SOURCES_BEGIN, report.SOURCES_END, "", report.PARTS_BEGIN, "| stale | table |",
    report.PARTS_END, "",
    report.HTTP_BEGIN, "## The webhook over TLS (bench/run_bench.py)", OLD_STAMP, "old figures", report.HTTP_END, "",
    "### Targets missed, by how much, and why", "* an old hand-written section outside any marker", "",
    "<!-- many-clients:begin (bench/many_clients.py) -->", "## Many keep-alive clients", "",
    OLD_STAMP, "rows", "<!-- many-clients:end -->", "",
    "<!-- apiserver-load:begin (bench/apiserver_load.py) -->", "## Pod creation through the API server",
    "rows from before stamps", "<!-- apiserver-load:end -->", ""])


def test_a_run_keeps_only_the_other_scripts_sections_and_the_table_names_every_part_s_run() -> None:
    out = report.keep_sections(OLD, _new())
    assert "Targets missed" not in out and "old figures" not in out and "| stale | table |" not in out
    assert out.count(report.HTTP_BEGIN) == 1 and "new figures" in out
    assert "## Many keep-alive clients\n\n" + OLD_STAMP + "\nrows" in out
    assert _table(out) == [
        "| The webhook over TLS (bench/run_bench.py) | 2026-11-25 14:00 UTC, commit 0123456789ab, `make bench` |",
        "| Many keep-alive clients | 2026-11-24 09:00 UTC, commit ba9876543210, `make bench` |",
        "| Pod creation through the API server | no run stamp: written before runs were stamped; see its own "
        "text for the date |"]


def test_a_section_written_later_replaces_its_old_one_and_its_row(tmp_path: Path) -> None:
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(report.keep_sections(OLD, _new()), encoding="utf-8")
    section = "\n".join(["<!-- apiserver-load:begin (bench/apiserver_load.py) -->",
                         "## Pod creation through the API server", "", STAMP, "new rows",
                         "<!-- apiserver-load:end -->", ""])
    report.write_section(out, section, "<!-- apiserver-load:begin (bench/apiserver_load.py) -->",
                         "<!-- apiserver-load:end -->")
    text = out.read_text(encoding="utf-8")
    assert "rows from before stamps" not in text and "new rows" in text
    assert _table(text)[-1] == ("| Pod creation through the API server | 2026-11-25 14:00 UTC, "
                                "commit 0123456789ab, `make bench` |")


@pytest.mark.parametrize("stamped", [False, True])
def test_an_included_file_with_its_own_markers_keeps_one_pair_and_names_its_run(
        stamped: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/inspect-scale.md carries its own markers; `make bench-inspect` stamps it with its run, an
    older file has no stamp and is named by the file and commit it comes from."""
    monkeypatch.setattr(provenance, "file_origin", lambda path: "bench/inspect-scale.md, last changed at commit abc")
    stamp = ["Run: 2026-11-25 18:57 UTC, commit 5e48fecbc176, `make bench-inspect`.", ""] if stamped else []
    path = tmp_path / "inspect-scale.md"
    path.write_text("\n".join(["<!-- inspect-scale:begin (bench/inspect_scale.py --report) -->",
                               "## `kubectl gpu-stack inspect` at scale", "", *stamp, "| table |",
                               "<!-- inspect-scale:end -->", ""]), encoding="utf-8")
    scale = "\n".join(report.included("inspect-scale", "make bench-inspect", path, "x"))
    assert scale.count("<!-- inspect-scale:begin") == 1 and scale.count("<!-- inspect-scale:end -->") == 1
    rows = provenance.sources(scale)
    assert len(rows) == 1
    if stamped:
        assert rows[0][1] == "2026-11-25 18:57 UTC, commit 5e48fecbc176, `make bench-inspect`"
        assert "*Included from bench/inspect-scale.md, last changed at commit abc.*" in scale
    else:
        assert "bench/inspect-scale.md" in rows[0][1]


def test_the_stamp_names_date_commit_and_command_and_is_what_the_table_reads() -> None:
    assert STAMP == "Run: 2026-11-25 14:00 UTC, commit 0123456789ab, `make bench`."
    section = f"<!-- x:begin (y) -->\n## X\n\n*{STAMP}*\n<!-- x:end -->"
    assert provenance.sources(section) == [("X", "2026-11-25 14:00 UTC, commit 0123456789ab, `make bench`")]
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=BENCH, capture_output=True, text=True,
                          check=True).stdout.strip()
    assert provenance.commit().split(" ")[0] == head  # the checkout measured


DIRTY_STAMP = provenance.stamp("make bench", when="2026-11-25 15:00 UTC", at="0123456789ab + uncommitted changes")


def test_a_part_measured_on_uncommitted_changes_puts_a_warning_at_the_top() -> None:
    clean = report.keep_sections(OLD, _new())
    dirty = report.refresh_sources(clean.replace(STAMP, DIRTY_STAMP))
    assert report.DIRTY_WARNING not in clean
    top = dirty.split(report.SOURCES_BEGIN, 1)[1].split(report.SOURCES_END, 1)[0]
    assert top.strip() == report.DIRTY_WARNING
    assert dirty.index(report.DIRTY_WARNING) < dirty.index(report.HTTP_BEGIN)


def test_the_parts_make_bench_writes_and_the_file_lacks_are_named() -> None:
    out = report.keep_sections(OLD, _new())
    missing = out.split("Not in this file yet (the next `make bench` writes them): ", 1)[1].split(".\n", 1)[0]
    assert missing.split("; ") == [f"{name} ({writer})" for name, writer in report.PARTS.items()
                                   if name not in ("http", "many-clients", "apiserver-load")]


def test_every_target_is_listed_with_its_verdict() -> None:
    text = report.refresh_sources("\n".join([
        _new(), "<!-- x:begin (bench/x.py) -->", "## X", STAMP, "", "| target | per round | result |", "|---|---|---|",
        "| a >= 0.8x | 0.9, 0.7 | **missed** |", "| b | 0 | met |", "",
        "Target, paced: c within 5% of d: **not met** (median 1.2x > 1.05x). More text.",
        "Target: e: met. `errors` are ...", "<!-- x:end -->", ""]))
    assert report.targets_of(text) == [("X", "a >= 0.8x", "**missed**"), ("X", "b", "met"),
                                       ("X", "paced: c within 5% of d", "**not met** (median 1.2x > 1.05x)"),
                                       ("X", "e", "met")]
    summary = text.split(report.TARGETS_BEGIN, 1)[1].split(report.TARGETS_END, 1)[0]
    assert "| X | paced: c within 5% of d | **not met** (median 1.2x > 1.05x) |" in summary


COMMITTED = BENCH.parent / "BENCHMARKS.md"


def test_the_committed_file_measured_committed_code() -> None:
    """A BENCHMARKS.md from a run on uncommitted changes cannot be reproduced: commit the code, run again."""
    text = COMMITTED.read_text(encoding="utf-8")
    dirty = [f"{part}: {run}" for part, run in provenance.sources(text) if report.DIRTY in run]
    assert dirty == [] and report.DIRTY_WARNING not in text, (
        "BENCHMARKS.md has parts measured on uncommitted changes; commit the code and run make bench again:\n"
        + "\n".join(dirty))


def test_the_committed_file_is_what_the_frame_and_its_parts_give() -> None:
    """The frame make bench writes, then the parts; refreshing the generated blocks changes nothing."""
    text = COMMITTED.read_text(encoding="utf-8")
    head = text.split(report.HTTP_BEGIN, 1)[0]
    refreshed_frame = report.refresh_sources("\n".join(report.frame_lines()) + "\n" + text[len(head):])
    assert refreshed_frame == text
    assert report.refresh_sources(text) == text
