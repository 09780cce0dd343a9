"""Scale benchmark of `kubectl gpu-stack inspect --usage --idle`: 1,000 GPU nodes and 8,000 GPU pods created
through a real API server, and a real Prometheus (Debian's package) that has scraped for the window a stand-in
dcgm-exporter with every one of those pods' series (gpu_stack_dev.dcgm_fixture, --kubernetes-virtual-gpus on);
the command timed (whole process), its Prometheus queries counted (its -v line) and its peak RSS read
(wait4). `make bench-inspect` runs it on a control plane of its own after bench/inspect_scale.py (whose
20,000 pods inspect would read too: it lists the pods of every node), and `--report` puts its figures at the
end of that benchmark's section (bench/inspect-scale.md and BENCHMARKS.md).

Cluster: nodes cycle through exclusive (8 A100, 8 pods with one GPU each), time-sliced (2 T4 x4, 8 pods),
MPS (1 L4 x10, 8 pods) and MIG (2 A100 as 14 x 1g.5gb, 8 pods); every third pod idle (under 5 %). The exporter
serves the three fields the command reads (names and help from the chart's metrics.csv): the chart's other
fields are series no query touches.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_stack_dev import inspect_cluster
from gpu_stack_dev.bench import inspect_scale as scale
from gpu_stack_dev.dcgm_fixture import Device, PodUse, chart_fields, exposition
from gpu_stack_dev.prometheus_server import Exporter, PrometheusServer

BIN = Path(sys.executable).parent
NODES, PER_NODE = 1000, 8
LABEL_VALUE = "usage-scale"
SELECTOR = f"{scale.LABEL_KEY}={LABEL_VALUE}"
WINDOW = 120  # seconds: --since 2m
INTERVAL = "5s"
METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED")
A100, T4, L4 = "NVIDIA A100-SXM4-40GB", "Tesla T4", "NVIDIA L4"


def _kind(index: int) -> dict[str, Any]:
    node = copy.deepcopy(inspect_cluster.NODES[index])
    labels, status = node["metadata"]["labels"], node["status"]
    if index == 0:
        labels["nvidia.com/gpu.count"] = "8"
        status["capacity"]["nvidia.com/gpu"] = status["allocatable"]["nvidia.com/gpu"] = "8"
    if index == 3:
        for key in [k for k in status["capacity"] if k.startswith("nvidia.com/mig-")]:
            del status["capacity"][key], status["allocatable"][key]
        status["capacity"]["nvidia.com/mig-1g.5gb"] = status["allocatable"]["nvidia.com/mig-1g.5gb"] = "14"
        labels["nvidia.com/gpu.count"], labels["nvidia.com/mig.config"] = "2", "all-1g.5gb"
    return node


KINDS = [_kind(i) for i in range(4)]
RESOURCE = ("nvidia.com/gpu", "nvidia.com/gpu", "nvidia.com/gpu", "nvidia.com/mig-1g.5gb")


def usage_nodes(count: int) -> list[dict[str, Any]]:
    nodes = []
    for i in range(count):
        node = copy.deepcopy(KINDS[i % 4])
        name = f"usage-{i:04d}-{node['metadata']['name']}"
        node["metadata"]["name"] = name
        node["metadata"]["labels"].update({"kubernetes.io/hostname": name, scale.LABEL_KEY: LABEL_VALUE})
        nodes.append(node)
    return nodes


def _pod_name(node: str, j: int) -> str:
    return f"{node}-{j}"


def _namespace(i: int, j: int) -> str:
    return scale.NAMESPACES[(i * PER_NODE + j) % len(scale.NAMESPACES)]


def _util(i: int, j: int) -> float:
    return 1.0 if (i * PER_NODE + j) % 3 == 0 else 20.0 + (i + j) % 60  # every third pod idle


def usage_pods(nodes: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], str | None]]:
    for i, node in enumerate(nodes):
        name = node["metadata"]["name"]
        for j in range(PER_NODE):
            pod = inspect_cluster.pod(_namespace(i, j), _pod_name(name, j), name,
                                      [inspect_cluster.container("main", {RESOURCE[i % 4]: 1})])
            pod.pop("status")
            yield pod, None


def devices(nodes: list[dict[str, Any]]) -> list[Device]:
    out: list[Device] = []
    for i, node in enumerate(nodes):
        name, kind = node["metadata"]["name"], i % 4
        pods = [PodUse(_namespace(i, j), _pod_name(name, j), "main", _util(i, j), 1000 + j, str(j))
                for j in range(PER_NODE)]
        if kind == 0:
            out += [Device(name, j, A100, pods[j].util, 1000 + j, [pods[j]]) for j in range(PER_NODE)]
        elif kind == 1:
            out += [Device(name, g, T4, max(p.util for p in pods[g * 4:g * 4 + 4]), 4000, pods[g * 4:g * 4 + 4],
                           shared=True) for g in range(2)]
        elif kind == 2:
            out.append(Device(name, 0, L4, max(p.util for p in pods), 9000, pods, shared=True))
        else:
            out += [Device(name, j // 7, A100, pods[j].util, 2000, [pods[j]], mig_profile="1g.5gb",
                           mig_instance=j % 7 + 7) for j in range(PER_NODE)]
    return out


def expected_idle(count: int) -> int:
    return sum(1 for i in range(count) for j in range(PER_NODE) if _util(i, j) < 5)


@dataclass
class UsageRun:
    output: str  # table | json
    wall: float
    cpu: float  # the process's user + system seconds
    api: float  # reading the cluster (its -v line)
    prometheus: float  # the clock and the range queries, with the join (its -v line)
    rss_mib: float
    queries: int
    requests: int
    idle: int
    status: int


ASKED = re.compile(r"asked Prometheus at .* (\d+) queries, ([\d.]+) s")


def _rss_of_child(command: list[str], env: dict[str, str]) -> tuple[float, float, int, bytes, bytes]:
    """(peak RSS in MiB, CPU seconds, exit status, stdout, stderr) of one child, read with wait4."""
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, env=env)
        out = proc.stdout.read() if proc.stdout is not None else b""
        _, status, usage = os.wait4(proc.pid, 0)
        errors.seek(0)
        err = errors.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime, proc.returncode, out, err


def _run(output: str, prometheus: str, env: dict[str, str]) -> UsageRun:
    started = time.perf_counter()
    rss, cpu, status, out, err = _rss_of_child(
        [str(BIN / "kubectl-gpu_stack"), "inspect", "-v", "-l", SELECTOR, "--usage", "--idle", "--since",
         f"{WINDOW}s", "--prometheus", prometheus, "-o", output], env)
    wall = time.perf_counter() - started
    stderr = err.decode()
    asked, read = ASKED.search(stderr), scale.VERBOSE.search(stderr)
    assert asked and read, stderr
    if output == "json":
        idle = len(json.loads(out)["usage"]["idle"]["holders"])
    else:  # the rows between the idle table's header and the blank line after it
        lines = out.decode().splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("idle GPU holders"))
        idle = next(i for i in range(at + 2, len(lines)) if not lines[i].startswith("  ")) - at - 2
    return UsageRun(output, wall, cpu, float(read.group(4)), float(asked.group(2)), rss, int(asked.group(1)),
                    int(read.group(3)), idle, status)


def measure(kubeconfig: Path, rounds: int = 3) -> tuple[scale.Populated, list[UsageRun], int]:
    """Create the cluster while Prometheus scrapes, wait for the window's samples, then time `rounds` runs."""
    nodes = usage_nodes(NODES)
    fields = tuple(f for f in chart_fields() if f[0] in METRICS)
    assert sorted(f[0] for f in fields) == sorted(METRICS), fields
    text = exposition(devices(nodes), fields, virtual_gpus=True)
    exporter = Exporter(lambda: text)
    try:
        with PrometheusServer([exporter.target], interval=INTERVAL) as prometheus:
            populated = scale.populate(kubeconfig, NODES, NODES * PER_NODE, objects=(nodes, list(usage_pods(nodes))))
            prometheus.wait_for_history("DCGM_FI_DEV_FB_USED", WINDOW, series=NODES * PER_NODE, timeout=600)
            runs = []
            env = {**os.environ, "KUBECONFIG": str(kubeconfig), "NO_COLOR": "1"}
            for output in ("table", "json"):
                for _ in range(rounds):
                    runs.append(_run(output, prometheus.url, env))
                    print(f"--usage --idle -o {output}: {runs[-1].wall:.2f} s, {runs[-1].rss_mib:.0f} MiB, "
                          f"{runs[-1].queries} queries, exit {runs[-1].status}", flush=True)
    finally:
        exporter.close()
    return populated, runs, len(text.splitlines())


def _mid(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


USAGE_HEADING = "### `inspect --usage --idle` against a real Prometheus (bench/inspect_usage.py)"


def add_to_report(lines: list[str]) -> None:
    """Put `lines` at the end of inspect_scale's section (replacing a previous run's), in its file and in
    BENCHMARKS.md."""
    text = scale.REPORT.read_text(encoding="utf-8")
    head = text.split(f"\n{USAGE_HEADING}", 1)[0] if USAGE_HEADING in text else text.split(scale.END, 1)[0]
    head = head.rstrip("\n").removesuffix(scale.END).rstrip("\n")
    section = "\n".join([head, *lines, scale.END]) + "\n"
    scale.write_report(section)


def check(runs: list[UsageRun]) -> str:
    """Why the runs are wrong, or empty: every run exit 0, 4 queries, the idle pods the cluster has."""
    wanted = expected_idle(NODES)
    found = sorted({(r.status, r.queries, r.idle) for r in runs})
    return "" if found == [(0, 4, wanted)] else f"runs gave (exit, queries, idle) {found}, wanted (0, 4, {wanted})"


def report_lines(populated: scale.Populated, runs: list[UsageRun], series_lines: int) -> list[str]:
    rows = []
    for output in ("table", "json"):
        group = [r for r in runs if r.output == output]
        walls, rss = sorted(r.wall for r in group), sorted(r.rss_mib for r in group)
        rows.append(f"| {output} | {len(group)} | {group[0].status} | {group[0].requests} | {group[0].queries} "
                    f"| {group[0].idle:,} | {_mid([r.api for r in group]):.2f} "
                    f"| {_mid([r.prometheus for r in group]):.2f} | {_mid(walls):.2f} "
                    f"| {walls[0]:.2f} / {walls[-1]:.2f} "
                    f"| {_mid([r.cpu for r in group]):.2f} | {_mid(rss):.0f} |")
    return [
        "",
        USAGE_HEADING,
        "",
        f"* Cluster: {populated.nodes:,} GPU nodes and {populated.pods:,} GPU pods (8 per node: whole GPUs, "
        "time-sliced, MPS, MIG) created through the API in "
        f"{populated.seconds:.1f} s; Prometheus {INTERVAL} scrapes of a stand-in dcgm-exporter with "
        f"{series_lines:,} lines per scrape (the 3 fields the command reads, per-process series for shared GPUs), "
        f"on the same machine.",
        f"* Command: `kubectl-gpu_stack inspect -l {SELECTOR} --usage --idle --since {WINDOW}s --prometheus URL "
        "-o OUTPUT`, the whole process; RSS: its peak resident set (wait4 ru_maxrss). Load average "
        f"{os.getloadavg()[0]:.1f} after the runs (a 2-CPU machine shared with other work).",
        "",
        "| output | runs | exit | API requests | Prometheus queries | idle pods listed | API time median (s) "
        "| Prometheus time median (s) | whole process median (s) | min / max (s) | process CPU median (s) "
        "| peak RSS median (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"Queries: the clock (time()) and one range query per metric over every series ({len(METRICS)}), never one "
        "per pod or node. API time: reading the cluster; Prometheus time: the queries (Prometheus evaluating them "
        "on the same machine) and the join (the command's -v lines); the queries run while the cluster is read, so "
        "the whole is less than their sum. Targets: under 5 s and under 300 MB RSS; "
        "timings are not asserted in tests.",
    ]
