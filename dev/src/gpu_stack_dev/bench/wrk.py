"""wrk runs against the servers, their figures (Run, Summary) and the alternating rounds of a comparison."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpu_stack_dev import paths
from gpu_stack_dev.bench.procfs import TICKS, passive_opens
from gpu_stack_dev.bench.servers import Server

LUA = paths.BENCH / "mix.lua"

@dataclass
class Run:
    target: str
    requests: int
    seconds: float
    errors: int
    latency_us: dict[str, float]
    late: int
    worst_late_ms: float
    cpu_s: float
    connections: int
    rate: int = 0
    # Established client connections per worker, sampled in the middle of the run (/proc/PID/fd).
    spread: dict[int, int] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def cpu_us_per_review(self) -> float:
        return 1e6 * self.cpu_s / self.requests if self.requests else 0.0

@dataclass
class Wrk:
    binary: str
    workdir: Path
    threads: int = 1
    runs: list[Run] = field(default_factory=list)

    def run(self, target: str, server: Server, manifest: Path, seconds: float, connections: int,
            rate: int = 0) -> Run:
        result = self.workdir / "wrk-result.json"
        result.unlink(missing_ok=True)
        duration = max(1, round(seconds)) + (1 if rate else 0)  # paced: mix.lua starts its schedule 0.5 s in
        argv = [self.binary, f"-t{self.threads}", f"-c{connections}", f"-d{duration}s", "--timeout", "10s",
                "-s", str(LUA), server.url, "--", str(manifest), str(rate), str(self.threads)]
        cpu0, opens0 = server.cpu_ticks(), passive_opens()
        proc = subprocess.Popen(argv, env={**os.environ, "BENCH_RESULT": str(result)}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        spread: dict[int, int] = {}
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=duration / 2 + 0.5)
        if proc.poll() is None:
            spread = server.connections()
        try:
            stdout, stderr = proc.communicate(timeout=seconds + 60)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        cpu1, opens1 = server.cpu_ticks(), passive_opens()
        if proc.returncode != 0 or not result.is_file():
            raise RuntimeError(f"wrk failed ({proc.returncode}): {stderr or stdout}")
        data = json.loads(result.read_text())
        run = Run(
            target=target, requests=data["requests"], seconds=data["duration_us"] / 1e6,
            errors=sum(data["errors"].values()), latency_us=data["latency_us"], late=data["late"],
            worst_late_ms=data["worst_late_ms"], cpu_s=(cpu1 - cpu0) / TICKS, connections=opens1 - opens0,
            rate=rate, spread=spread,
        )
        self.runs.append(run)
        return run

def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0

@dataclass
class Summary:
    target: str
    runs: list[Run]

    def med(self, fn: Callable[[Run], float]) -> float:
        return median([fn(r) for r in self.runs])

    @property
    def requests(self) -> int:
        return sum(r.requests for r in self.runs)

    @property
    def errors(self) -> int:
        return sum(r.errors for r in self.runs)

    @property
    def connections(self) -> int:
        return sum(r.connections for r in self.runs)

    @property
    def late(self) -> int:
        return sum(r.late for r in self.runs)

def merged(runs: list[Run]) -> Run:
    """The runs of one server in one round as one: counts, time and CPU added up; each latency
    percentile the slowest run's; the spread of the first run that sampled one."""
    first = runs[0]
    return Run(
        target=first.target, requests=sum(r.requests for r in runs), seconds=sum(r.seconds for r in runs),
        errors=sum(r.errors for r in runs),
        latency_us={key: max(r.latency_us[key] for r in runs) for key in first.latency_us},
        late=sum(r.late for r in runs), worst_late_ms=max(r.worst_late_ms for r in runs),
        cpu_s=sum(r.cpu_s for r in runs), connections=sum(r.connections for r in runs), rate=first.rate,
        spread=next((r.spread for r in runs if r.spread), {}),
    )

def alternate(wrk: Wrk, targets: list[tuple[str, Server, Path]], rounds: int, seconds: float,
              connections: int, rate: int = 0, slices: int = 1) -> dict[str, Summary]:
    """`rounds` rounds of `seconds` per target, the order reversed every other round. With `slices` > 1 a
    round gives each target its time as that many runs in mirrored order (A B C C B A for two), merged
    into one: the machine's speed drifts between runs by more than the differences measured here, and a
    drift that is linear over the round then falls on every target alike."""
    out: dict[str, Summary] = {name: Summary(name, []) for name, _, _ in targets}
    for i in range(rounds):
        order = targets if i % 2 == 0 else list(reversed(targets))
        parts: dict[str, list[Run]] = {name: [] for name, _, _ in targets}
        for k in range(slices):
            for name, server, manifest in (order if k % 2 == 0 else list(reversed(order))):
                parts[name].append(wrk.run(name, server, manifest, seconds / slices, connections, rate))
        for name, _, _ in order:
            run = merged(parts[name])
            out[name].runs.append(run)
            label = f"{rate}/s" if rate else "saturation"
            print(f"  round {i + 1} {name:9} {label:10} {run.rps:8.0f} req/s"
                  f"  p50 {run.latency_us['p50'] / 1000:6.2f} ms"
                  f"  p99 {run.latency_us['p99'] / 1000:6.2f} ms  p99.9 {run.latency_us['p999'] / 1000:6.2f} ms"
                  f"  cpu {run.cpu_us_per_review:5.0f} µs/review  errors {run.errors}  conns {run.connections}"
                  f"  late {run.late}  per worker {sorted(run.spread.values())}", flush=True)
    return out
