"""bench/served_instructions.py's reading of callgrind's files (gpu_stack_dev.bench.callgrind), the L2 it has
callgrind simulate, and its report (no valgrind run here: `make bench` runs it; `bench/served_instructions.py
--quick` is its smoke test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_stack_dev.bench import callgrind, report
from gpu_stack_dev.bench import served_instructions as si

# The head of a dump as callgrind 3.19 writes it with --cache-sim=yes --branch-sim=yes.
DUMP = """# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 19706
desc: I1 cache: 32768 B, 64 B, 8-way associative
desc: D1 cache: 32768 B, 64 B, 8-way associative
desc: LL cache: 1048576 B, 64 B, 8-way associative
desc: Trigger: dump
positions: line
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw Bc Bcm Bi Bim
summary: 677433299 188396861 108123985 18388739 9185163 3512323 18 913 11296 86409763 10191368 37185143 14465491

fl=(1) ???
"""

# callgrind_annotate --inclusive=yes --show=Ir,ILmr,DLmr,DLmw lines (3.19): a function, its recursive entry,
# another object's; a count of 0 is written without its share.
ANNOTATED = """--------------------------------------------------------------------------------
Ir                   ILmr             DLmr             DLmw
--------------------------------------------------------------------------------
677,433,299 (100.0%) 512,245 (100.0%) 635,350 (100.0%) 373,841 (100.0%)  PROGRAM TOTALS

  167,769,187 (24.77%)  16,841 ( 3.29%)  50,666 ( 7.97%) 115,457 (30.88%)  ???:loads [/x/orjson/orjson.so]
  117,498,955 (17.34%) 112,118 (21.89%)  64,037 (10.08%)  14,529 ( 3.89%)  w.c:CPyDef_decide___review [m.so]
      900,000 ( 0.13%)   1,210 ( 0.24%)       51 ( 0.01%)       0           w.c:CPyDef_decide___review'2 [m.so]
       40,000 ( 0.01%)       0                 0                 0           w.c:CPyDef_metrics___record [m.so]
"""


def test_a_dump_gives_each_event_its_count() -> None:
    counts = callgrind.dump_counts(DUMP)
    assert counts["Ir"] == 677433299
    assert counts["I1mr"] == 18388739
    assert counts["Bcm"] + counts["Bim"] == 10191368 + 14465491
    assert all(event in counts for names in si.COLUMNS.values() for event in names)


def test_a_file_that_is_not_a_dump_is_refused() -> None:
    with pytest.raises(ValueError, match="not a callgrind dump"):
        callgrind.dump_counts("events: Ir\n")


def test_inclusive_reads_every_count_of_the_outermost_entry_of_exactly_the_names_asked() -> None:
    found = callgrind.inclusive(ANNOTATED, ["loads", "CPyDef_decide___review", "CPyDef_metrics___record", "x"])
    assert found == {"loads": (167769187, 16841, 50666, 115457), "CPyDef_decide___review": (117498955, 112118, 64037,
                                                                                             14529),
                     "CPyDef_metrics___record": (40000, 0, 0, 0)}


def test_the_cache_model_is_read_from_the_dump(tmp_path: Path) -> None:
    dump = tmp_path / "1.out.1"
    dump.write_text(DUMP)
    assert callgrind.cache_model(dump) == ("I1 cache: 32768 B, 64 B, 8-way associative; "
                                           "D1 cache: 32768 B, 64 B, 8-way associative; "
                                           "LL cache: 1048576 B, 64 B, 8-way associative")


def _cache(root: Path, index: int, level: int, kind: str, size: str, ways: str, line: str = "64") -> None:
    folder = root / f"index{index}"
    folder.mkdir()
    for name, value in (("level", str(level)), ("type", kind), ("size", size), ("ways_of_associativity", ways),
                        ("coherency_line_size", line)):
        (folder / name).write_text(value + "\n")


def test_the_l2_is_read_from_sysfs_as_callgrinds_last_level(tmp_path: Path) -> None:
    # This VM's cpu0 (AMD EPYC): L1d, L1i, a unified 1 MiB 8-way L2, a 32 MiB L3.
    _cache(tmp_path, 0, 1, "Data", "32K", "8")
    _cache(tmp_path, 1, 1, "Instruction", "32K", "8")
    _cache(tmp_path, 2, 2, "Unified", "1024K", "8")
    _cache(tmp_path, 3, 3, "Unified", "32768K", "16")
    assert callgrind.l2_option(tmp_path) == "--LL=1048576,8,64"


def test_an_l2_of_any_ways_is_taken_when_its_sets_are_a_power_of_two(tmp_path: Path) -> None:
    _cache(tmp_path, 2, 2, "Unified", "1280K", "10")  # Intel's 1.25 MiB, 10 ways: 2,048 sets
    assert callgrind.l2_option(tmp_path) == "--LL=1310720,10,64"


def test_no_l2_callgrind_can_simulate_gives_none(tmp_path: Path) -> None:
    assert callgrind.l2_option(tmp_path) is None  # no caches in sysfs (some VMs)
    _cache(tmp_path, 2, 2, "Unified", "1536K", "8")  # 3,072 sets: callgrind wants a power of two (cg_arch.c)
    assert callgrind.l2_option(tmp_path) is None


def _round(instructions: float, loads: float) -> tuple[si.Counts, si.Counts, si.Counts]:
    events = {"instructions": instructions, "I1 misses": instructions / 40, "D1 misses": instructions / 60,
              "L2 misses": instructions / 500, "mispredicted branches": instructions / 50}
    functions = dict.fromkeys(si.FUNCTIONS, 0.0) | {"JSON parse (orjson.loads)": loads}
    l2 = dict.fromkeys(si.FUNCTIONS, 0.0) | {"JSON parse (orjson.loads)": loads / 1000}
    return events, functions, l2


def _rounds() -> dict[str, dict[str, si.Rounds]]:
    return {body: {"allow-all": [_round(1_000_000, 180_000), _round(900_000, 180_000)],
                   "/validate": [_round(1_100_000, 180_000), _round(1_080_000, 180_000)],
                   "/mutate": [_round(1_050_000, 180_000), _round(990_000, 180_000)]}
            for body in ("the pod mix", "one identical body")}


def _render(l2: str | None) -> str:
    return si.render(_rounds(), {"the pod mix": 600, "one identical body": 300}, 2, "Machine: test", "cmd", 10.0, l2)


def _table(text: str, header: str) -> list[list[str]]:
    """The rows (cells) of the table whose header starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_the_report_gives_each_server_its_counts_and_its_ratio_to_the_allow_all_of_the_same_round() -> None:
    text = _render("--LL=1048576,8,64")
    assert text.startswith(si.BEGIN) and text.rstrip().endswith(si.END)
    header, _, *body = _table(text, "| bodies | server")
    assert header[5:] == ["I1 misses", "x allow-all", "D1 misses", "x allow-all", "L2 misses", "x allow-all",
                          "mispredicted branches", "x allow-all"]
    rows = {tuple(cells[:2]): cells for cells in body}
    validate = rows[("the pod mix", "/validate")]
    # Median over the rounds of 1,100,000 and 1,080,000; the ratios are per round (1.100 and 1.200), then median.
    assert validate[2] == "1,090,000"
    assert validate[3] == "1.150"
    assert validate[4] == "1.100, 1.200"
    assert validate[9:11] == ["2,180", "1.150"]  # L2 misses: a 500th of the instructions here
    assert rows[("the pod mix", "allow-all")][3] == "1.000"
    assert "`--LL=1048576,8,64`" in text
    instructions = {cells[0]: cells[1:] for cells in _table(text, "| function: instructions")}
    assert instructions["JSON parse (orjson.loads)"].count("180,000") == 5  # four webhook columns and the allow-all's
    assert instructions["the rules (decide.review)"] == ["-"] * 5  # not measured: a dash, not 0
    l2_misses = {cells[0]: cells[1:] for cells in _table(text, "| function: L2 misses")}
    assert l2_misses["JSON parse (orjson.loads)"] == ["180"] * 5
    # No target is judged here: nothing for the summary of targets and verdicts.
    assert report.targets_of(text) == []


def test_without_an_l2_the_report_says_so_and_has_no_l2_figures() -> None:
    text = _render(None)
    header = _table(text, "| bodies | server")[0]
    assert "L2 misses" not in header and len(header) == 5 + 2 * 3
    assert "sysfs describes no L2" in text
    assert "| function: L2 misses" not in text


def test_make_bench_writes_the_part() -> None:
    assert report.PARTS["served-instructions"] == "bench/served_instructions.py"
    assert "bench/served_instructions.py --out BENCHMARKS.md" in (si.REPO_ROOT / "Makefile").read_text()
