"""Reading what valgrind's callgrind writes (3.19), and the second-level cache it is told to simulate.

callgrind simulates two cache levels: the first-level instruction and data caches, and one last level ("LL").
By default it takes the LL's geometry from the CPU's last cache; on a VM that reading can be meaningless
(this project's VM: 256 MB direct-mapped). `l2_option` sets the LL to this CPU's L2 as sysfs describes it, so
an LL miss is what a real L2 miss is: a line fetched from the L3 or memory. cachegrind's manual (`--LL`)
requires a line and a number of sets that are powers of two; sysfs gives the geometry.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

SYSFS_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")
# callgrind_annotate --inclusive=yes lines: a count per event shown ("n (p%)", or a bare "0"), then
# "file:function [object]".
_ANNOTATED = re.compile(r"^\s*(?P<counts>(?:[\d,]+(?:\s+\(\s*[\d.]+%\))?\s+)+)(?P<where>[^\d\s].*?)(?:\s+\[.*\])?\s*$")
_SHARE = re.compile(r"\([^)]*\)")
_UNITS = {"K": 1024, "M": 1024 * 1024}


def dump_counts(text: str) -> dict[str, int]:
    """{event: count} from a callgrind dump's `events:` and `summary:` lines."""
    events = summary = None
    for line in text.splitlines():
        if line.startswith("events:"):
            events = line.split(":", 1)[1].split()
        elif line.startswith("summary:"):
            summary = [int(v) for v in line.split(":", 1)[1].split()]
    if events is None or summary is None:
        raise ValueError("not a callgrind dump: no events or summary line")
    return dict(zip(events, summary + [0] * (len(events) - len(summary)), strict=True))


def inclusive(annotated: str, names: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """{function: its counts with its callees, one per event shown} from `callgrind_annotate --inclusive=yes
    --show=...` output; the first (outermost) line of each name, not its recursive entries (`name'2`)."""
    found: dict[str, tuple[int, ...]] = {}
    for line in annotated.splitlines():
        m = _ANNOTATED.match(line)
        if not m:
            continue
        function = m.group("where").rsplit(":", 1)[-1]
        if function in names and function not in found:
            found[function] = tuple(int(c.replace(",", "")) for c in _SHARE.sub("", m.group("counts")).split())
    return found


def cache_model(dump: Path) -> str:
    """The caches callgrind simulated, from a dump's `desc:` lines (`I1 cache: 32768 B, 64 B, 8-way ...`)."""
    found = [line.removeprefix("desc: ").strip() for line in dump.read_text(errors="replace").splitlines()[:20]
             if line.startswith(("desc: I1 cache", "desc: D1 cache", "desc: LL cache"))]
    return "; ".join(found) or "not stated in the dump"


def l2_option(caches: Path = SYSFS_CACHES) -> str | None:
    """`--LL=size,associativity,line` for this CPU's level-2 cache (unified or data), or None when sysfs does
    not describe one with the sizes callgrind accepts."""
    for index in sorted(caches.glob("index*")):
        try:
            level, kind = (index / "level").read_text().strip(), (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()  # "1024K"
            size_bytes = int(size[:-1]) * _UNITS[size[-1]] if size[-1:] in _UNITS else int(size)
            ways = int((index / "ways_of_associativity").read_text())
            line = int((index / "coherency_line_size").read_text())
        except (OSError, ValueError):
            continue
        if level != "2" or kind not in ("Unified", "Data") or ways <= 0 or line <= 0:
            continue
        # cachegrind's --LL: the line and the number of sets each a power of two.
        if _power_of_two(line) and size_bytes % (ways * line) == 0 and _power_of_two(size_bytes // (ways * line)):
            return f"--LL={size_bytes},{ways},{line}"
    return None


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0
