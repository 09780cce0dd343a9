"""BENCHMARKS.md as bench/run_bench.py writes it: the frame and the marked sections (its HTTP section: report_http).

The file is made of marked sections (`<!-- name:begin (writer) -->` ... `<!-- name:end -->`), each
stamped with the run that wrote it (provenance.stamp: date, commit, command), under a frame this module
writes: the title, how the file is made, the method, and a block (refresh_sources, rewritten by every
writer) with the table of parts and their runs, the parts missing, every target with its verdict, and,
when any part measured a checkout with uncommitted changes, a warning saying so at the top (a test refuses
such a file in a commit). bench/run_bench.py writes the whole file anew: the frame, its own section, then
the files it includes (bench/soak.md from `make soak`, bench/inspect-scale.md from `make bench-inspect`,
each labelled with the commit that last changed it); of the old file it keeps only the marked sections
other scripts wrote (PARTS), which carry their own stamps. Nothing else survives a run.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpu_stack_dev import paths
from gpu_stack_dev.bench import provenance

INSPECT_SCALE = paths.BENCH / "inspect-scale.md"


TITLE = "# Benchmarks"
# The marked sections `make bench` writes, in the order it writes them, and who writes each.
PARTS = {
    "http": "bench/run_bench.py",
    "soak": "make soak (bench/soak.md, included)",
    "inspect-scale": "make bench-inspect (bench/inspect-scale.md, included)",
    "served-instructions": "bench/served_instructions.py",
    "many-clients": "bench/many_clients.py",
    "apiserver-load": "bench/apiserver_load.py --part load",
    "apiserver-calls": "bench/apiserver_load.py --part calls",
    "scheduler-scale": "bench/scheduler_scale.py",
    "pod-startup": "bench/pod_startup.py (as root, on a real node)",
}
DIRTY = "+ uncommitted changes"
DIRTY_WARNING = ("**Not reproducible: a part of this file measured a checkout with uncommitted changes** (its run "
                 "below says `" + DIRTY + "`). Commit the code, run `make bench` again, and commit the file it "
                 "writes; tests/bench/test_bench_report.py refuses this file in a commit.")
INTRO = ("Written whole by `make bench` (hack/bench_policy.py and bench/run_bench.py, then "
         "bench/served_instructions.py, bench/many_clients.py, "
         "bench/apiserver_load.py, bench/scheduler_scale.py and bench/pod_startup.py; `make soak` and "
         "`make bench-inspect` write the parts "
         "it includes). Do not edit it by hand: each part says which run wrote it, on which commit. The history of "
         "how the review path got to these figures is in git (`git log -p -- BENCHMARKS.md bench/analysis.md`).")
METHOD = [
    "## Method",
    "",
    "* The machine is the project's shared 2-CPU VM: other work runs beside the bench, so absolute figures move "
    "from run to run. The servers are measured in alternating rounds, and the ratios (same run, same noise) are "
    "the figures to compare; CPU per review (from /proc, so it counts neither the load generator nor other "
    "tenants) is the steadiest figure. Each part names its machine, load and rounds.",
    "* Closed-loop latency at saturation is queueing, not service time; the latency the API server sees is the "
    "fixed-rate one.",
    "* Load: wrk with a Lua script (bench/mix.lua) that paces sends on a fixed schedule where a fixed rate is "
    "wanted (Debian's wrk has no constant-rate mode) and counts sends that missed their slot, so queueing is not "
    "hidden (coordinated omission).",
    "* Targets are judged in every round of the run that wrote the part, not on an average of runs.",
    "",
]
HTTP_BEGIN, HTTP_END = "<!-- http:begin (bench/run_bench.py) -->", "<!-- http:end -->"
# Rewritten by refresh_sources whenever a part changes: the warning (dirty runs), the targets, the parts.
SOURCES_BEGIN, SOURCES_END = "<!-- sources:begin (gpu_stack_dev.bench.report) -->", "<!-- sources:end -->"
TARGETS_BEGIN = "<!-- targets-summary:begin (gpu_stack_dev.bench.report) -->"
TARGETS_END = "<!-- targets-summary:end -->"
PARTS_BEGIN, PARTS_END = "<!-- parts:begin (gpu_stack_dev.bench.report) -->", "<!-- parts:end -->"
_GENERATED = provenance.GENERATED


def frame_lines() -> list[str]:
    """The head of the file, above the parts: title, the warning block, how the file is made, the method, the
    targets and the parts (the blocks are filled by refresh_sources)."""
    return [TITLE, "", SOURCES_BEGIN, SOURCES_END, "", INTRO, "", *METHOD, TARGETS_BEGIN, TARGETS_END, "",
            PARTS_BEGIN, PARTS_END, ""]


def included(name: str, writer: str, path: Path, what: str) -> list[str]:
    """A kept file as a marked section; its own `Run:` line (if its writer stamps it) names the run,
    else a line says which file and commit it comes from."""
    text = path.read_text(encoding="utf-8").rstrip()
    origin = provenance.file_origin(path)
    has_stamp = any(line.strip().strip("*").startswith(provenance.STAMP_PREFIX) for line in text.splitlines())
    note = f"*Included from {origin}.*" if has_stamp else f"*{provenance.STAMP_PREFIX}{what}; {origin}.*"
    begin, end = f"<!-- {name}:begin ({writer}) -->", f"<!-- {name}:end -->"
    if text.startswith(f"<!-- {name}:begin"):  # the file carries its own markers
        begin, text = text.split("\n", 1)
        text = text.removesuffix(end).rstrip()
    heading, _, rest = text.partition("\n")
    return [begin, heading, "", note, rest.rstrip(), end, ""]


_SECTION = re.compile(r"<!-- (?P<name>[\w-]+):begin[^>]*-->.*?<!-- (?P=name):end -->", re.DOTALL)


def keep_sections(old: str, new: str) -> str:
    """`new` with the marked sections of `old` it lacks appended (bench/many_clients.py and
    bench/apiserver_load.py write theirs between markers after this report; a run of this script alone
    keeps them, and their stamps say which run they are from). Nothing else of `old` is kept."""
    kept = [m.group(0) for m in _SECTION.finditer(old)
            if m.group("name") not in _GENERATED and m.group("name") != "analysis"
            and f"<!-- {m.group('name')}:begin" not in new]
    return refresh_sources("\n\n".join([new.rstrip("\n"), *kept]) + "\n")


def refresh_sources(text: str) -> str:
    """`text` with its generated blocks rewritten from its parts: at the top the warning when a part measured
    uncommitted changes (else nothing); the targets and their verdicts; the table of parts and their runs,
    and the parts `make bench` writes that the file lacks."""
    if SOURCES_BEGIN not in text or SOURCES_END not in text:
        return text
    parts = provenance.sources(text)
    warning = [DIRTY_WARNING] if any(DIRTY in run for _, run in parts) else []
    text = _replace_block(text, SOURCES_BEGIN, SOURCES_END, warning)
    if TARGETS_BEGIN in text and TARGETS_END in text:
        rows = ["## Targets and verdicts", "", "| part | target | verdict |", "|---|---|---|"]
        rows += [f"| {part} | {target} | {verdict} |" for part, target, verdict in targets_of(text)]
        text = _replace_block(text, TARGETS_BEGIN, TARGETS_END, rows)
    if PARTS_BEGIN in text and PARTS_END in text:
        rows = ["## Where each part of this file comes from", "",
                "| part | run (date, commit measured, command) |", "|---|---|"]
        rows += [f"| {heading} | {run} |" for heading, run in parts]
        present = {m.group("name") for m in _SECTION.finditer(text)}
        missing = [f"{name} ({writer})" for name, writer in PARTS.items() if name not in present]
        if missing:
            rows += ["", "Not in this file yet (the next `make bench` writes them): " + "; ".join(missing) + "."]
        text = _replace_block(text, PARTS_BEGIN, PARTS_END, rows)
    return text


def _replace_block(text: str, begin: str, end: str, lines: list[str]) -> str:
    head, rest = text.split(begin, 1)
    body = "\n".join(lines)
    return head + begin + ("\n" + body if body else "") + "\n" + end + rest.split(end, 1)[1]


_VERDICT = re.compile(r"^(?P<target>.*?):\s*(?P<verdict>\*\*not met\*\*|not met|met)(?!\w)(?P<rest>.*)$")


def targets_of(text: str) -> list[tuple[str, str, str]]:
    """(part, target, verdict) for every target the parts judge: the rows of their `| target | ... | result |`
    tables, and their `Target...: ... met / **not met** (...)` lines."""
    found: list[tuple[str, str, str]] = []
    for m in _SECTION.finditer(text):
        if m.group("name") in _GENERATED:
            continue
        part = ""
        header: list[str] | None = None
        for line in m.group(0).splitlines():
            if line.startswith("## "):
                part = line[3:].strip()
            cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
            if cells is None:
                header = None
                if line.startswith("Target"):
                    target, _, judged = line.partition(": ")
                    verdict = _VERDICT.match(judged)
                    if verdict:
                        qualifier = target.removeprefix("Target").strip(" ,")
                        judged_target = verdict.group("target")
                        if qualifier:
                            judged_target = f"{qualifier}: {judged_target}"
                        said = f"{verdict.group('verdict')}{verdict.group('rest')}".split(". ", 1)[0].rstrip(".")
                        found.append((part, judged_target.strip(), said.strip()))
                continue
            if header is None:
                header = [c.lower() for c in cells]
                continue
            if set("".join(cells)) <= set("-: "):
                continue
            if header and header[0] == "target" and header[-1] in ("result", ""):
                found.append((part, cells[0], cells[-1] or cells[-2]))
    return found


def write_section(path: Path, section: str, begin: str, end: str) -> None:
    """Put `section` (which starts with `begin` and ends with `end`) into the file, replacing the old one,
    and refresh the table of parts."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section.rstrip("\n") + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + section
    path.write_text(refresh_sources(text), encoding="utf-8")


