"""BENCHMARKS.md says where each of its parts comes from (issue 26): a run keeps nothing of the old file
but the sections other scripts wrote, each stamped with its run; files it includes say which commit
they come from; the table at the top follows every writer. No timing here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import provenance  # noqa: E402
import report  # noqa: E402

STAMP = provenance.stamp("make bench", when="2026-11-25 14:00 UTC", at="0123456789ab")
OLD_STAMP = provenance.stamp("make bench", when="2026-11-24 09:00 UTC", at="ba9876543210")


def _new() -> str:
    return "\n".join([report.TITLE, "", report.SOURCES_BEGIN, report.SOURCES_END, "", report.HTTP_BEGIN,
                      "## The webhook over TLS (bench/run_bench.py)", "", STAMP, "", "## Headline: the pod mix",
                      "new figures", report.HTTP_END, ""])


def _table(text: str) -> list[str]:
    inside = text.split(report.SOURCES_BEGIN, 1)[1].split(report.SOURCES_END, 1)[0]
    return [line for line in inside.splitlines() if line.startswith("| ") and not line.startswith("| part ")]


OLD = "\n".join([
    report.TITLE, "", report.SOURCES_BEGIN, "| stale | table |", report.SOURCES_END, "",
    report.HTTP_BEGIN, "## The webhook over TLS (bench/run_bench.py)", OLD_STAMP, "old figures", report.HTTP_END, "",
    "### Targets missed, by how much, and why", "* an old hand-written section outside any marker", "",
    "<!-- many-clients:begin (bench/many_clients.py) -->", "## Many keep-alive clients (issue 18)", "",
    OLD_STAMP, "rows", "<!-- many-clients:end -->", "",
    "<!-- apiserver-load:begin (bench/apiserver_load.py) -->", "## Pod creation through the API server (issue 18)",
    "rows from before stamps", "<!-- apiserver-load:end -->", ""])


def test_a_run_keeps_only_the_other_scripts_sections_and_the_table_names_every_part_s_run() -> None:
    out = report.keep_sections(OLD, _new())
    assert "Targets missed" not in out and "old figures" not in out and "| stale | table |" not in out
    assert out.count(report.HTTP_BEGIN) == 1 and "new figures" in out
    assert "## Many keep-alive clients (issue 18)\n\n" + OLD_STAMP + "\nrows" in out
    assert _table(out) == [
        "| The webhook over TLS (bench/run_bench.py) | 2026-11-25 14:00 UTC, commit 0123456789ab, `make bench` |",
        "| Many keep-alive clients (issue 18) | 2026-11-24 09:00 UTC, commit ba9876543210, `make bench` |",
        "| Pod creation through the API server (issue 18) | no run stamp: written before runs were stamped "
        "(issue 26); see its own text for the date |"]


def test_a_section_written_later_replaces_its_old_one_and_its_row(tmp_path: Path) -> None:
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(report.keep_sections(OLD, _new()), encoding="utf-8")
    section = "\n".join(["<!-- apiserver-load:begin (bench/apiserver_load.py) -->",
                         "## Pod creation through the API server (issue 18)", "", STAMP, "new rows",
                         "<!-- apiserver-load:end -->", ""])
    report.write_section(out, section, "<!-- apiserver-load:begin (bench/apiserver_load.py) -->",
                         "<!-- apiserver-load:end -->")
    text = out.read_text(encoding="utf-8")
    assert "rows from before stamps" not in text and "new rows" in text
    assert _table(text)[-1] == ("| Pod creation through the API server (issue 18) | 2026-11-25 14:00 UTC, "
                                "commit 0123456789ab, `make bench` |")


def test_included_files_are_marked_and_say_which_commit_they_come_from() -> None:
    analysis = report._included("analysis", "hand-written: bench/analysis.md", report.ANALYSIS, "no run: hand-written")
    assert analysis[0] == "<!-- analysis:begin (hand-written: bench/analysis.md) -->"
    assert analysis[1] == "## Analysis (hand-written: bench/analysis.md)"
    assert analysis[3].startswith("*Run: no run: hand-written; bench/analysis.md, ")
    assert analysis[-2] == "<!-- analysis:end -->"


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
    scale = "\n".join(report._included("inspect-scale", "make bench-inspect", path, "x"))
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
