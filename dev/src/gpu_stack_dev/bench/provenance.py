"""Which run wrote what in BENCHMARKS.md (everything there comes from the run that wrote it, or says which
run it is from).

Every writer stamps its part with `stamp(command)`: one line, `Run: <UTC date>, commit <sha>, <command>`,
where the commit is the checkout measured (with "+ uncommitted changes" when files other than the bench's
own outputs differ from it). Files that are kept and included rather than written by the run (the
hand-written analysis, bench/soak.md, bench/inspect-scale.md) are described by `file_origin`: the commit
and date that last changed them. `sources` lists every part of a BENCHMARKS.md text with its run, for the
table at its top (report.refresh_sources).
"""

from __future__ import annotations

import datetime
import re
import subprocess
from pathlib import Path

from gpu_stack_dev.paths import ROOT as REPO_ROOT

STAMP_PREFIX = "Run: "
# What the bench itself writes while it runs: a change there is the run's output, not code measured.
OUTPUTS = ("BENCHMARKS.md", "bench/flamegraphs", "bench/soak.md", "bench/inspect-scale.md")


def _git(*args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def commit() -> str:
    """The short commit of the checkout, "+ uncommitted changes" when tracked files other than OUTPUTS differ."""
    sha = _git("rev-parse", "--short=12", "HEAD") or "unknown (not a git checkout)"
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", ".", *(f":!{p}" for p in OUTPUTS))
    return f"{sha} + uncommitted changes" if dirty else sha


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def stamp(command: str, when: str | None = None, at: str | None = None) -> str:
    return f"{STAMP_PREFIX}{when or now()}, commit {at or commit()}, `{command}`."


def file_origin(path: Path) -> str:
    """`path`, last changed at commit X on date Y (git log), and whether it differs from that commit."""
    rel = path.resolve().relative_to(REPO_ROOT).as_posix()
    line = _git("log", "-1", "--format=%h %cd", "--date=format-local:%Y-%m-%d %H:%M UTC", "--", rel)
    if not line:
        return f"{rel}, not committed yet"
    sha, date = line.split(" ", 1)
    dirty = _git("status", "--porcelain", "--", rel)
    return f"{rel}, last changed at commit {sha} ({date})" + (" + uncommitted changes" if dirty else "")


# The blocks gpu_stack_dev.bench.report derives from the parts (refresh_sources): not parts themselves.
GENERATED = ("sources", "targets-summary", "parts")
_MARKED = re.compile(r"<!-- (?P<name>[\w-]+):begin(?P<rest>[^>]*)-->(?P<body>.*?)<!-- (?P=name):end -->", re.DOTALL)
_HEADING = re.compile(r"^## (.+)$", re.MULTILINE)


def sources(text: str) -> list[tuple[str, str]]:
    """(section heading, its run) for every marked section of `text`, in order; a section without a stamp
    line says so."""
    out = []
    for m in _MARKED.finditer(text):
        if m.group("name") in GENERATED:
            continue
        body = m.group("body")
        heading = _HEADING.search(body)
        run = next((line.strip().strip("*").removeprefix(STAMP_PREFIX).rstrip(".")
                    for line in body.splitlines() if line.strip().strip("*").startswith(STAMP_PREFIX)),
                   "no run stamp: written before runs were stamped; see its own text for the date")
        out.append((heading.group(1) if heading else m.group("name"), run))
    return out
