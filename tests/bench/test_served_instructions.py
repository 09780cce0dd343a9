"""bench/served_instructions.py's reading of callgrind's files and its report (no valgrind run here: `make bench`
runs it; `bench/served_instructions.py --quick` is its smoke test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_stack_dev.bench import report
from gpu_stack_dev.bench import served_instructions as si

# The head of a dump as callgrind 3.19 writes it with --cache-sim=yes --branch-sim=yes.
DUMP = """# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 19706
desc: I1 cache: 32768 B, 64 B, 8-way associative
desc: D1 cache: 32768 B, 64 B, 8-way associative
desc: LL cache: 268435456 B, 64 B, direct-mapped
desc: Trigger: dump
positions: line
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw Bc Bcm Bi Bim
summary: 677433299 188396861 108123985 18388739 9185163 3512323 18 913 11296 86409763 10191368 37185143 14465491

fl=(1) ???
"""

# callgrind_annotate --inclusive=yes --show=Ir lines (3.19): a function, its recursive entry, another object's.
ANNOTATED = """--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
677,433,299 (100.0%)  PROGRAM TOTALS

  167,769,187 (24.77%)  ???:loads [/x/orjson/orjson.cpython-311-x86_64-linux-gnu.so]
  117,498,955 (17.34%)  /w/build/__native_x.c:CPyDef_decide___review [/x/78024fb4__mypyc.so]
      900,000 ( 0.13%)  /w/build/__native_x.c:CPyDef_decide___review'2 [/x/78024fb4__mypyc.so]
       40,000 ( 0.01%)  /w/build/__native_x.c:CPyDef_decide___reviews [/x/78024fb4__mypyc.so]
"""


def test_a_dump_gives_each_event_its_count() -> None:
    counts = si.dump_counts(DUMP)
    assert counts["Ir"] == 677433299
    assert counts["I1mr"] == 18388739
    assert counts["Bcm"] + counts["Bim"] == 10191368 + 14465491
    assert all(event in counts for names in si.COLUMNS.values() for event in names)


def test_a_file_that_is_not_a_dump_is_refused() -> None:
    with pytest.raises(ValueError, match="not a callgrind dump"):
        si.dump_counts("events: Ir\n")


def test_inclusive_reads_the_outermost_entry_of_exactly_the_names_asked() -> None:
    found = si.inclusive(ANNOTATED, ["loads", "CPyDef_decide___review", "CPyDef_metrics___Metrics___record"])
    assert found == {"loads": 167769187, "CPyDef_decide___review": 117498955}


def test_the_cache_model_is_read_from_the_dump(tmp_path: Path) -> None:
    dump = tmp_path / "1.out.1"
    dump.write_text(DUMP)
    assert si.cache_model(dump) == ("I1 cache: 32768 B, 64 B, 8-way associative; "
                                    "D1 cache: 32768 B, 64 B, 8-way associative")


def _round(instructions: float, loads: float) -> tuple[si.Counts, si.Counts]:
    events = {"instructions": instructions, "I1 misses": instructions / 40, "D1 misses": instructions / 60,
              "mispredicted branches": instructions / 50}
    functions = dict.fromkeys(si.FUNCTIONS, 0.0) | {"JSON parse (orjson.loads)": loads}
    return events, functions


def test_the_report_gives_each_server_its_counts_and_its_ratio_to_the_allow_all_of_the_same_round() -> None:
    rounds = {body: {"allow-all": [_round(1_000_000, 180_000), _round(900_000, 180_000)],
                     "/validate": [_round(1_100_000, 180_000), _round(1_080_000, 180_000)],
                     "/mutate": [_round(1_050_000, 180_000), _round(990_000, 180_000)]}
              for body in ("the pod mix", "one identical body")}
    text = si.render(rounds, {"the pod mix": 600, "one identical body": 300}, 2, "Machine: test", "cmd", 10.0)
    assert text.startswith(si.BEGIN) and text.rstrip().endswith(si.END)
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): [c.strip() for c in line.strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| the pod mix") or line.startswith("| one identical")}
    validate = rows[("the pod mix", "/validate")]
    # Median over the rounds of 1,100,000 and 1,080,000; the ratios are per round (1.100 and 1.200), then median.
    assert validate[2] == "1,090,000"
    assert validate[3] == "1.150"
    assert validate[4] == "1.100, 1.200"
    assert rows[("the pod mix", "allow-all")][3] == "1.000"
    parse = next(line for line in text.splitlines() if line.startswith("| JSON parse"))
    assert parse.count("180,000") == 5  # four webhook columns and the allow-all's
    rules = next(line for line in text.splitlines() if line.startswith("| the rules"))
    assert rules.count("| -") == 5  # not measured: a dash, not 0
    # No target is judged here: nothing for the summary of targets and verdicts.
    assert report.targets_of(text) == []


def test_make_bench_writes_the_part() -> None:
    assert report.PARTS["served-instructions"] == "bench/served_instructions.py"
    assert "bench/served_instructions.py --out BENCHMARKS.md" in (si.REPO_ROOT / "Makefile").read_text()
