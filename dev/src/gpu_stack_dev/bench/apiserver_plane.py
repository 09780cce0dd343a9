"""The control plane under measurement (bench/apiserver_load.py): its processes, their CPU time and connections,
the API server's metrics, and waiting until it is quiet."""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

from gpu_stack_dev.bench.apiserver_metrics import WEBHOOK_METRIC, samples, total
from gpu_stack_dev.bench.apiserver_webhooks import HOOKS
from gpu_stack_dev.e2e import apiload, e2elib

QUIET_CORES = 0.15  # the control plane and the servers together, averaged over one window

QUIET_WINDOW = 0.5

SETTLE_LIMIT = 20.0

TICKS = os.sysconf("SC_CLK_TCK")

# --- /proc and /metrics ----------------------------------------------------------------------------
def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes and their direct children (a gunicorn master and its workers)."""
    total = 0
    wanted = set(pids)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) in wanted or int(fields[1]) in wanted:  # fields[1] = ppid
            total += int(fields[11]) + int(fields[12])
    return total / TICKS

def closed_connections(port: int) -> set[tuple[int, int]]:
    """(local, remote) ports of the TCP connections to or from `port` now in TIME-WAIT (closed within the
    last 60 s), from /proc/net. A set, so connections closed before a batch are not counted in it."""
    hexport = f":{port:04X}"
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, remote, state = line.split()[1:4]
                if state == "06" and (local.endswith(hexport) or remote.endswith(hexport)):
                    found.add((int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)))
    return found

async def watch_closed(port: int, seen: set[tuple[int, int]]) -> None:
    """Collect closed connections every 2 s until cancelled (TIME-WAIT lasts 60 s, a batch may last longer)."""
    while True:
        seen |= closed_connections(port)
        await asyncio.sleep(2)

def plane_pids(plane: Any) -> dict[str, int]:
    """{"etcd": pid, "kube-apiserver": pid, ...} of the plane's processes, by their command line."""
    out = {}
    for pid in plane.pids:
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        out[Path(argv0.decode()).name] = pid
    return out

def etcd_url(apiserver_pid: int) -> str:
    for arg in Path(f"/proc/{apiserver_pid}/cmdline").read_bytes().decode().split("\0"):
        if arg.startswith("--etcd-servers="):
            return arg.split("=", 1)[1].split(",")[0]
    return ""

class Snapshot:
    """What the API server and etcd counted so far (before and after a batch)."""

    def __init__(self, cluster: e2elib.E2ECluster, etcd: str) -> None:
        page = samples(cluster.kubectl("get", "--raw", "/metrics").stdout)
        self.calls = {h: total(page, f"{WEBHOOK_METRIC}_count", {h}) for h in HOOKS}
        self.seconds = {h: total(page, f"{WEBHOOK_METRIC}_sum", {h}) for h in HOOKS}
        self.gc = total(page, "go_gc_duration_seconds_count")
        etcd_text = ""
        if etcd:
            with urllib.request.urlopen(f"{etcd}/metrics", timeout=10) as reply:  # noqa: S310 (loopback)
                etcd_text = reply.read().decode()
        self.compactions = total(samples(etcd_text),
                                 "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_count")

def settle(pids: list[int]) -> float:
    """Wait until the processes use less than QUIET_CORES over a window; seconds waited."""
    began = time.monotonic()
    while time.monotonic() - began < SETTLE_LIMIT:
        before = cpu_seconds(pids)
        time.sleep(QUIET_WINDOW)
        if (cpu_seconds(pids) - before) / QUIET_WINDOW < QUIET_CORES:
            break
    return time.monotonic() - began

class Bench:
    def __init__(self, plane: Any, cluster: e2elib.E2ECluster) -> None:
        self.cluster = cluster
        self.pids = plane_pids(plane)
        self.etcd = etcd_url(self.pids["kube-apiserver"])
        self.url, self.context = apiload.api_server(cluster)
        self.tokens: dict[str, str] = {}
        self.quiet_pids = list(self.pids.values())


async def delete_pods(client: Any, url: str, token: str, namespace: str) -> None:
    """Every pod of the namespace, gone (none is scheduled, so none waits for a grace period)."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    pods = f"{url}/api/v1/namespaces/{namespace}/pods"
    async with client.delete(pods, headers=headers) as reply:
        await reply.read()
        if reply.status != 200:
            raise RuntimeError(f"DELETE {pods}: HTTP {reply.status}")
    for _ in range(200):
        async with client.get(f"{pods}?limit=1", headers=headers) as reply:
            if not (await reply.json())["items"]:
                return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"pods of {namespace} still there after deleting them")
