"""`make soak`: the webhook under steady load for a long time, at half of its measured capacity.

    .venv/bin/python hack/soak.py [--seconds 600] [--connections 16] [--rate N]

1. starts `gpu-stack-webhook serve` over TLS (workers/threads as deployed, or $GPU_STACK_WEBHOOK_*),
2. measures capacity: wrk closed loop for --capacity-seconds over the /validate + /mutate mix of
   gpu_stack_dev.bench.bodies (skipped with --rate),
3. warms up for --warmup seconds at half of it, then samples the RSS of every worker,
4. runs wrk paced at that rate (bench/mix.lua keeps a fixed send schedule) for --seconds
   ($SOAK_SECONDS through make),
5. samples the RSS again and prints the figures,
6. many clients: --many-clients (200) keep-alive TLS clients in closed loop for
   --many-seconds, with N/4 handshaken-but-silent and N/4 never-TLS connections held open beside them
   (bench/many_clients.SilentConnections: what Go's HTTP client leaves behind).

Worker RSS (VmRSS of every worker) is printed at the start of the soak (after the warm-up) and at its
end; with --report (make soak: bench/soak.md) the figures and the verdict are written as a markdown
section that `make bench` puts into BENCHMARKS.md.

Passes (exit 0) with zero errors (socket errors and non-2xx), the same worker processes at the end
(none died and was replaced), every worker's RSS growth under 5 %, and in the many-clients phase zero
errors and no answer slower than 1 s. Loopback only; every wrk run is
bounded by its duration.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpu_stack_webhook.tls.certs import write_loopback_pki

from gpu_stack_dev.bench import bodies, many_clients, provenance
from gpu_stack_dev.bench.procfs import status_kb
from gpu_stack_dev.bench.servers import VENV_BIN, Server, ensure_wrk, free_port
from gpu_stack_dev.bench.wrk import Run, Wrk

MAX_RSS_GROWTH = 0.05
MANY_MAX_MS = 1000.0


def rss_kb(server: Server) -> dict[int, int]:
    return {pid: status_kb(pid, "VmRSS") for pid in sorted(server.workers())}


def run_many_clients(wrk: Wrk, server: Server, manifest: Path, clients: int,
                     seconds: int) -> tuple[many_clients.SilentConnections, Run]:
    silent = many_clients.SilentConnections(server.port, server.ca_file, clients // 4)
    try:
        return silent, wrk.run("many", server, manifest, seconds, clients)
    finally:
        silent.close()


def many_clients_failures(clients: int, silent: many_clients.SilentConnections, many: Run) -> list[str]:
    print(f"many clients: {clients} keep-alive + {2 * (clients // 4)} silent connections "
          f"({silent.failed} not opened): {many.requests} reviews in {many.seconds:.0f}s ({many.rps:.0f}/s), "
          f"{many.errors} errors, p99 {many.latency_us.get('p99', 0) / 1000:.1f} ms, "
          f"max {many.latency_us.get('max', 0) / 1000:.1f} ms")
    worst_ms = many.latency_us.get("max", 0) / 1000
    if many.errors or silent.failed or worst_ms >= MANY_MAX_MS:
        return [f"many clients: {many.errors} errors, {silent.failed} silent connections not opened, "
                f"slowest answer {worst_ms:.0f} ms (limit {MANY_MAX_MS:.0f})"]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=int(os.environ.get("SOAK_SECONDS", "600")))
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--capacity-seconds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--rate", type=int, default=0, help="requests/s to hold (default: half the measured capacity)")
    parser.add_argument("--many-clients", type=int, default=200, help="0: skip the many-clients phase")
    parser.add_argument("--many-seconds", type=int, default=30)
    parser.add_argument("--report", type=Path,
                        help="write the figures and verdict as markdown (make soak: bench/soak.md)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    wrk_binary = ensure_wrk()

    with tempfile.TemporaryDirectory(prefix="gpu-stack-soak-") as tmp_name:
        tmp = Path(tmp_name)
        write_loopback_pki(tmp)
        (tmp / "policy.yaml").write_text("{}\n")
        manifest = bodies.write_manifest(bodies.mix("validate") + bodies.mix("mutate"), tmp / "bodies", "soak")
        port = free_port()
        server = Server("webhook", [str(VENV_BIN / "gpu-stack-webhook"), "serve", "--config", str(tmp / "policy.yaml"),
                                    "--cert", str(tmp / "tls.crt"), "--key", str(tmp / "tls.key"),
                                    "--bind", f"127.0.0.1:{port}"],
                        port, tmp / "ca.crt", tmp / "webhook.log")
        wrk = Wrk(wrk_binary, tmp)
        server.start()
        idle_rss = rss_kb(server)  # may miss a worker still starting; only printed
        try:
            rate = args.rate
            if not rate:
                capacity = wrk.run("capacity", server, manifest, args.capacity_seconds, args.connections)
                rate = max(1, int(capacity.rps / 2))
                print(f"capacity: {capacity.rps:.0f} reviews/s closed loop ({args.connections} connections, "
                      f"{capacity.errors} errors); soak rate {rate}/s", flush=True)
            warm = wrk.run("warm-up", server, manifest, args.warmup, args.connections, rate=rate)
            start_rss = rss_kb(server)
            print(f"warm-up: {warm.requests} reviews in {warm.seconds:.0f}s, {warm.errors} errors; worker RSS at the "
                  f"start of the soak: {', '.join(f'{pid} {kb / 1024:.1f} MB' for pid, kb in start_rss.items())}",
                  flush=True)
            began = time.monotonic()
            soak = wrk.run("soak", server, manifest, args.seconds, args.connections, rate=rate)
            end_rss = rss_kb(server)
            elapsed = time.monotonic() - began
            many = (run_many_clients(wrk, server, manifest, args.many_clients, args.many_seconds)
                    if args.many_clients else None)
        finally:
            server.stop()

    result = SoakResult(rate=rate, seconds=soak.seconds, soak=soak, warm=warm, start_rss=start_rss,
                        end_rss=end_rss, idle_rss=idle_rss)
    print(f"soak: {soak.seconds:.0f}s ({elapsed:.0f}s wall) at {rate}/s target: {soak.requests} reviews, "
          f"{soak.rps:.0f}/s achieved, {soak.errors} errors, p50 {soak.latency_us.get('p50', 0) / 1000:.2f} ms, "
          f"p99 {soak.latency_us.get('p99', 0) / 1000:.2f} ms, {soak.late} late sends")
    for line in result.rss_lines():
        print("  " + line)
    many_failures = many_clients_failures(args.many_clients, *many) if many else []
    failures = result.failures() + many_failures
    print("soak: " + _verdict(failures))
    if args.report:
        many_line = (f"Many clients ({args.many_clients} keep-alive + silent connections, {args.many_seconds} s): "
                     f"{many[1].requests:,} reviews, {many[1].errors} errors, max "
                     f"{many[1].latency_us.get('max', 0) / 1000:.0f} ms: {_verdict(many_failures)}") if many else ""
        args.report.write_text(result.markdown(os.getloadavg(), many_line), encoding="utf-8")
        print(f"soak: report written to {args.report}")
    return 1 if failures else 0


def _verdict(failures: list[str]) -> str:
    return "FAILED: " + "; ".join(failures) if failures else "passed"


@dataclass
class SoakResult:
    rate: int
    seconds: float
    soak: Run
    warm: Run
    start_rss: dict[int, int]  # worker pid -> VmRSS kB after the warm-up
    end_rss: dict[int, int]  # ... at the end of the soak
    idle_rss: dict[int, int] = field(default_factory=dict)  # ... before any load

    def growth(self) -> dict[int, float]:
        return {pid: (self.end_rss[pid] - kb) / kb for pid, kb in self.start_rss.items() if pid in self.end_rss and kb}

    def failures(self) -> list[str]:
        out = []
        if self.soak.errors or self.warm.errors:
            out.append(f"{self.soak.errors + self.warm.errors} errors")
        if set(self.start_rss) != set(self.end_rss):
            out.append(f"workers changed: {sorted(self.start_rss)} -> {sorted(self.end_rss)}")
        growth = self.growth()
        if growth and max(growth.values()) >= MAX_RSS_GROWTH:
            out.append(f"RSS growth {max(growth.values()):.2%} >= {MAX_RSS_GROWTH:.0%}")
        return out

    def rss_lines(self) -> list[str]:
        growth = self.growth()
        return [f"worker {pid}: RSS idle {self.idle_rss.get(pid, 0) / 1024:.1f} MB, start {kb / 1024:.1f} MB -> end "
                f"{self.end_rss.get(pid, 0) / 1024:.1f} MB ({growth.get(pid, float('nan')):+.2%})"
                for pid, kb in sorted(self.start_rss.items())]

    def markdown(self, loadavg: tuple[float, float, float], many_clients: str = "") -> str:
        """The report section; its `Verdict:` line judges the soak itself (errors, workers, RSS growth),
        the many-clients phase has its own line."""
        when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        p50, p99 = (self.soak.latency_us.get(k, 0) / 1000 for k in ("p50", "p99"))
        load = " / ".join(f"{x:.2f}" for x in loadavg)
        return "\n".join([
            "## Soak (make soak, hack/soak.py)", "",
            provenance.stamp("make soak"), "",
            f"{when}; {self.seconds:.0f} s at {self.rate}/s (half the measured capacity) over the /validate + "
            f"/mutate mix: {self.soak.requests:,} reviews, {self.soak.errors} errors, p50 {p50:.2f} ms, "
            f"p99 {p99:.2f} ms; load average at the end {load}. "
            f"Worker VmRSS (limit: growth under {MAX_RSS_GROWTH:.0%} from the start of the soak to its end):", "",
            *[f"* {line}" for line in self.rss_lines()], "",
            *([many_clients, ""] if many_clients else []),
            f"Verdict: {_verdict(self.failures())}", ""])


if __name__ == "__main__":
    sys.exit(main())
