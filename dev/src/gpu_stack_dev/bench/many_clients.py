"""`make bench`, many keep-alive clients: N persistent TLS clients with silent connections mixed in.

    .venv/bin/python bench/many_clients.py [--out BENCHMARKS.md] [--quick] [--rounds 2] [--seconds 8]

For N in 8, 50, 100, 200, wrk keeps N keep-alive TLS connections busy (closed loop, one review per
connection at a time) while this script holds N/4 more connections that complete the TLS handshake and
send nothing, and N/4 that never start TLS: what Go's HTTP client (the API server) leaves behind when a
fresh dial loses the race against a connection that freed up, and what a port scanner or a stuck client
does. Side by side in one run, rounds alternating the order:

* `bare (stock gthread)`: bench/baseline_app.py (parse the review, allow) on gunicorn's own gthread
  worker with one shared listening socket, the serving model our worker (worker.PollingThreadWorker) replaces;
* `bare`: the same allow-all on our settings (gunicorn_conf: worker.PollingThreadWorker, reuse_port);
* `validate`, `mutate`: `gpu-stack-webhook serve` with the default policy.

Every server: 2 workers x 4 threads (as deployed), TLS 1.3 with an ECDSA P-256 certificate. The body is
a 3-container GPU pod with 20 env vars per container. What is compared are ratios within the run: each
target's throughput at N against its own at N=8, and the worst latency (wrk's max) against 1 s.
The section is written into --out between markers, replacing the previous one.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import ssl
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from gpu_stack_webhook.tls.certs import write_loopback_pki

from gpu_stack_dev.bench import bodies, provenance, report, run_bench
from gpu_stack_dev.bench import servers as servers_
from gpu_stack_dev.bench import wrk as wrk_
from gpu_stack_dev.paths import ROOT

CLIENTS = (8, 50, 100, 200)
BEGIN = "<!-- many-clients:begin (bench/many_clients.py) -->"
END = "<!-- many-clients:end -->"
TARGET_RATIO = 0.8
TARGET_MAX_MS = 1000.0
# What the target judges: the webhook's endpoints (the allow-all servers are the comparison) at many clients.
JUDGED = ("validate", "mutate")
JUDGED_CLIENTS = (100, 200)


class SilentConnections:
    """`count` connections that finish the TLS handshake and send nothing, and `count` that never start
    TLS, opened in a background thread (a stalled server must not stall the bench) and held until close()."""

    def __init__(self, port: int, ca_file: Path, count: int) -> None:
        self.port, self.count = port, count
        self.context = ssl.create_default_context(cafile=str(ca_file))
        self.sockets: list[socket.socket] = []
        self.failed = 0
        self.thread = threading.Thread(target=self._open, daemon=True)
        self.thread.start()

    def _open(self) -> None:
        for _ in range(self.count):
            for tls in (True, False):
                try:
                    raw = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                    self.sockets.append(self.context.wrap_socket(raw, server_hostname="127.0.0.1") if tls else raw)
                except OSError:
                    self.failed += 1

    def close(self) -> None:
        self.thread.join(30)
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


@dataclass
class Cell:
    runs: list[wrk_.Run] = field(default_factory=list)
    silent_failed: int = 0

    @property
    def rps(self) -> float:
        return wrk_.median([r.rps for r in self.runs])

    @property
    def worst_ms(self) -> float:
        return max((r.latency_us["max"] for r in self.runs), default=0.0) / 1000

    def p99_ms(self) -> float:
        return wrk_.median([r.latency_us["p99"] for r in self.runs]) / 1000

    @property
    def errors(self) -> int:
        return sum(r.errors for r in self.runs)


def measure(wrk: wrk_.Wrk, targets: list[tuple[str, servers_.Server, Path]], rounds: int,
            seconds: float) -> dict[str, dict[int, Cell]]:
    cells: dict[str, dict[int, Cell]] = {name: {n: Cell() for n in CLIENTS} for name, _, _ in targets}
    for i in range(rounds):
        for n in CLIENTS:
            order = targets if i % 2 == 0 else list(reversed(targets))
            for name, server, manifest in order:
                silent = SilentConnections(server.port, server.ca_file, max(2, n // 4))
                try:
                    run = wrk.run(name, server, manifest, seconds, n)
                finally:
                    silent.close()
                cell = cells[name][n]
                cell.runs.append(run)
                cell.silent_failed += silent.failed
                print(f"  round {i + 1} {name:22} N={n:<4} {run.rps:7.0f} req/s"
                      f"  p99 {run.latency_us['p99'] / 1000:7.1f} ms"
                      f"  max {run.latency_us['max'] / 1000:7.1f} ms  errors {run.errors}"
                      f"  silent conns not opened {silent.failed}", flush=True)
    return cells


def render(cells: dict[str, dict[int, Cell]], rounds: int, seconds: float, command: str) -> str:
    out = [BEGIN, "## Many keep-alive clients", "", provenance.stamp(command), "",
           f"Generated by `{command}` (bench/many_clients.py; {rounds} rounds of {seconds:g} s per cell, order "
           "alternating; medians of throughput and p99, worst max over the rounds). wrk holds N keep-alive TLS "
           "connections busy while N/4 handshaken-but-silent and N/4 never-TLS connections stay open beside "
           "them. Servers: 2 workers x 4 threads; `bare (stock gthread)` is the allow-all on gunicorn's own "
           "gthread worker (the serving model `gpu-stack-webhook serve` replaced), the others run on "
           "worker.PollingThreadWorker with one listening socket per worker.", "",
           "| target | N | reviews/s | vs N=8 | p99 ms | max ms | errors | silent not opened | target met |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    missed = []
    for name, by_n in cells.items():
        base = by_n[CLIENTS[0]].rps or 1.0
        for n, cell in by_n.items():
            ratio = cell.rps / base
            ok = cell.errors == 0 and cell.worst_ms < TARGET_MAX_MS and (n == CLIENTS[0] or ratio >= TARGET_RATIO)
            out.append(f"| {name} | {n} | {cell.rps:.0f} | {ratio:.2f}x | {cell.p99_ms():.1f} | {cell.worst_ms:.1f} "
                       f"| {cell.errors} | {cell.silent_failed} | {'yes' if ok else '**no**'} |")
            if name in JUDGED and n in JUDGED_CLIENTS and not ok:
                missed.append(f"{name} at {n}")
    verdict = f"**not met** ({', '.join(missed)})" if missed else "met"
    out += ["", f"Target: /validate and /mutate at {' and '.join(map(str, JUDGED_CLIENTS))} clients answer every "
            f"request, none slower than {TARGET_MAX_MS:.0f} ms, with >= {TARGET_RATIO}x the throughput of 8 clients "
            f"in the same run: {verdict}. `errors` are wrk's socket errors and timeouts (10 s); `silent not opened` "
            "are silent connections whose handshake the server did not complete within 5 s.", END]
    return "\n".join(out) + "\n"


def write_section(path: Path, section: str, begin: str = BEGIN, end: str = END) -> None:
    """Put `section` into the file, replacing the old one (report.write_section)."""
    report.write_section(path, section, begin, end)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--quick", action="store_true", help="one round of 1 s per cell (smoke test)")
    args = parser.parse_args(argv)
    rounds, seconds = (1, 1.0) if args.quick else (args.rounds, args.seconds)
    wrk_binary = servers_.ensure_wrk()
    run_bench.enter_netns()
    with tempfile.TemporaryDirectory(prefix="gpu-stack-many-") as tmp_name:
        tmp = Path(tmp_name)
        write_loopback_pki(tmp)
        policy = tmp / "policy.yaml"
        policy.write_text("{}\n")
        manifests = {ep: bodies.write_manifest([bodies.Body("gpu-pod-3c", f"/{ep}", bodies.scaled_pod(ep, 3, env=20),
                                                            True)], tmp / "bodies", ep) for ep in bodies.ENDPOINTS}
        tls = ["--cert", str(tmp / "tls.crt"), "--key", str(tmp / "tls.key")]
        sizing = ["--workers", "2", "--threads", "4"]
        servers: dict[str, servers_.Server] = {}

        def server(name: str, argv: list[str]) -> servers_.Server:
            port = servers_.free_port()
            servers[name] = servers_.Server(name, [*argv, *tls, *sizing, "--bind", f"127.0.0.1:{port}"], port,
                                             tmp / "ca.crt", tmp / f"{name.split(maxsplit=1)[0]}-{port}.log")
            return servers[name]

        baseline = [sys.executable, str(run_bench.BENCH_DIR / "baseline_app.py")]
        stock = server("bare (stock gthread)", [*baseline, "--stock-gthread"])
        bare = server("bare", baseline)
        hook = server("webhook", [str(servers_.VENV_BIN / "gpu-stack-webhook"), "serve", "--config", str(policy),
                                  "--log-level", "warning"])
        targets = [("bare (stock gthread)", stock, manifests["validate"]), ("bare", bare, manifests["validate"]),
                   ("validate", hook, manifests["validate"]), ("mutate", hook, manifests["mutate"])]
        wrk = wrk_.Wrk(wrk_binary, tmp)
        try:
            for s in servers.values():
                s.start()
            for name, s, manifest in targets:
                wrk.run(name, s, manifest, 1, 8)  # warm-up
            cells = measure(wrk, targets, rounds, seconds)
        finally:
            for s in servers.values():
                s.stop()
    command = "make bench" if not (argv or sys.argv[1:]) else "bench/many_clients.py " + " ".join(argv or sys.argv[1:])
    section = render(cells, rounds, seconds, command)
    write_section(args.out, section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
