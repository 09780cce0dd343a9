"""Summarise py-spy's collapsed stacks (`py-spy record -f raw`): where a worker's busy time goes.

    python bench/profile_summary.py worker.raw [--top 25]

Idle samples (threads waiting in select/epoll/queue get) are dropped; percentages are of busy samples.
`self` is time in the frame itself, `inclusive` time with everything it called.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

IDLE = ("select (selectors.py", "_worker (concurrent/futures/thread.py", "wait (threading.py", "sleep")
FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^:()]+)(?::(?P<line>\d+))?\)$")


def _short(frame: str) -> str:
    """`func (path/to/module.py:123)` -> `func (module.py)`: lines merged, paths shortened."""
    m = FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    file = m.group("file")
    parts = file.split("/")
    short = "/".join(parts[-2:]) if len(parts) > 1 else file
    return f"{m.group('func')} ({short})"


def summarise(text: str, top: int = 25) -> tuple[int, list[tuple[str, float, float]]]:
    """(busy samples, [(frame, self %, inclusive %)] by inclusive time)."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    busy = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = [_short(f) for f in stack.split(";") if f.strip()]
        if not frames or frames[-1].startswith(IDLE) or any(f.startswith(IDLE) for f in frames[-1:]):
            continue
        count = int(count_text)
        busy += count
        own[frames[-1]] += count
        for frame in set(frames):
            incl[frame] += count
    if not busy:
        return 0, []
    rows = [(f, 100.0 * own[f] / busy, 100.0 * n / busy) for f, n in incl.most_common()]
    return busy, rows[:top]


def self_top(text: str, top: int = 15) -> list[tuple[str, float]]:
    busy, _ = summarise(text, 0)
    own: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = [_short(f) for f in stack.split(";") if f.strip()]
        if frames and not frames[-1].startswith(IDLE):
            own[frames[-1]] += int(count_text)
    return [(f, 100.0 * n / busy) for f, n in own.most_common(top)] if busy else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("raw", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    text = args.raw.read_text(encoding="utf-8")
    busy, rows = summarise(text, args.top)
    print(f"busy samples: {busy}")
    print(f"{'inclusive %':>11} {'self %':>7}  frame")
    for frame, own, incl in rows:
        print(f"{incl:11.1f} {own:7.1f}  {frame}")
    print("\ntop self time:")
    for frame, pct in self_top(text):
        print(f"{pct:7.1f}  {frame}")


if __name__ == "__main__":
    main()
