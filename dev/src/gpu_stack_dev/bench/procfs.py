"""What /proc says about the servers under load: CPU ticks, memory, workers and their connections, TCP passive opens."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")

def children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            text = (task / "children").read_text()
            out.extend(int(p) for p in text.split())
    return out

def cpu_ticks(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat.rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of proc(5))

def status_kb(pid: int, key: str) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0

def pss_kb(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0

def passive_opens() -> int:
    lines = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines() if line.startswith("Tcp:")]
    return int(lines[1][lines[0].index("PassiveOpens")])

def _established_inodes(port: int) -> set[str]:
    """Socket inodes of the ESTABLISHED TCP connections whose local port is `port` (this network namespace)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if len(cols) > 9 and cols[3] == "01" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(cols[9])
    return inodes

def worker_connections(pid: int, workers: list[int], port: int) -> dict[int, int]:
    """Established client connections each worker holds: its /proc/PID/fd sockets that are ESTABLISHED
    connections to `port` (the master's listening sockets and idle fds are not counted)."""
    established = _established_inodes(port)
    out: dict[int, int] = {}
    for worker in workers:
        count = 0
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{worker}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:[") and link[8:-1] in established:
                        count += 1
        out[worker] = count
    return out
