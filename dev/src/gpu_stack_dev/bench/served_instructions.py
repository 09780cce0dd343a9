"""Instructions per served review, counted by valgrind's callgrind: the webhook beside the allow-all, in
figures another tenant of the machine does not move.

    .venv/bin/python bench/served_instructions.py [--out BENCHMARKS.md] [--rounds 2] [--quick]

Why: the throughput ratios of bench/run_bench.py move by about ±0.05 from round to round on the shared
2-CPU VM, more than one commit changes them. callgrind counts what a server executes instead of timing it:
instructions, and, from its simulation of this CPU's caches and branch predictors (`--cache-sim=yes
--branch-sim=yes`), first-level instruction and data cache misses, misses of this CPU's L2 (callgrind.l2_option)
and mispredicted branches. The same code on the same requests gives about the same counts whatever else runs;
what moves between rounds is the threads' interleaving (who takes the GIL when), so each round is shown.

What runs: the allow-all (bench/baseline_app.py) and `gpu-stack-webhook serve` with the policy the chart
renders for bodies.MIX_VALUES, each as one gunicorn worker of THREADS threads (gunicorn_conf.settings
otherwise) under `valgrind --tool=callgrind`. Each keeps CLIENTS keep-alive TLS connections, opened before
anything is counted. Per round and target: a request on every connection (a server may have closed an idle
one), the worker's counters zeroed (`callgrind_control -z`), every body sent once over the connections,
the counters dumped (`callgrind_control -d`): every thread of the worker, gunicorn, TLS and the app. Per
review = the dump's summary / reviews answered. Bodies: the pod mix (bodies.pod_mix with MIX bodies: the
shares of the HTTP part's 3,000) and the one identical body (bodies.gpu_pod_3c), as in bench/run_bench.py.
The webhook's own functions, from `callgrind_annotate --inclusive=yes`, show where its extra instructions and
L2 misses go.

Periodic work (the metrics flusher's second, the request-deadline watchdog) falls in the counted window too,
which valgrind's slower clock makes longer: a little more of it per review than at full speed, for both servers.

Counts are not time: a miss or a mispredicted branch costs many cycles, so the CPU ratio of run_bench.py can
be larger than the instruction ratio. The caches simulated are valgrind's model: the first level's geometry
read from the CPU, the L2's from sysfs; one cache for every thread of the worker, where the HTTP part's two
workers run on two cores.
"""

from __future__ import annotations

import argparse
import http.client
import platform
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpu_stack_webhook.tls.certs import write_loopback_pki

from gpu_stack_dev.bench import bodies, provenance, report, run_bench
from gpu_stack_dev.bench.callgrind import cache_model, dump_counts, inclusive, l2_option
from gpu_stack_dev.bench.servers import VENV_BIN, Server, chart_policy, ensure_tool, free_port
from gpu_stack_dev.paths import BENCH
from gpu_stack_dev.paths import ROOT as REPO_ROOT

BEGIN = "<!-- served-instructions:begin (bench/served_instructions.py) -->"
END = "<!-- served-instructions:end -->"
THREADS = 4
CLIENTS = 4
MIX = 600
ONE_BODY = 300
# callgrind's events (--cache-sim=yes --branch-sim=yes) as the report groups them.
# "L2 misses" are callgrind's last level ("LL"), set to this CPU's L2 (callgrind.l2_option).
COLUMNS = {"instructions": ("Ir",), "I1 misses": ("I1mr",), "D1 misses": ("D1mr", "D1mw"),
           "L2 misses": ("ILmr", "DLmr", "DLmw"), "mispredicted branches": ("Bcm", "Bim")}
L2 = "L2 misses"
SHOWN = ("Ir", *COLUMNS[L2])  # what callgrind_annotate shows per function
# The webhook's own compiled functions (mypyc's names) and orjson's parse, counted with what they call.
FUNCTIONS = {
    "the review route (ReviewRoutes.__call__: the body, the reply, metrics, the log)":
        "CPyDef_review_routes___ReviewRoutes_____call__",
    "the reply (pipeline.answer: parse, decide, encode)": "CPyDef_pipeline___answer",
    "JSON parse (orjson.loads)": "loads",
    "reading the review (review.parse_review)": "CPyDef_review___parse_review",
    "the rules (decide.review)": "CPyDef_decide___review",
    "metrics (Metrics.record)": "CPyDef_metrics___Metrics___record",
    "decision log (decision_log.log_reply)": "CPyDef_decision_log___log_reply",
}


def dumps_dir(tmp: Path, name: str) -> Path:
    """Where callgrind writes the dumps of the server called `name`."""
    return tmp / f"callgrind-{name}"


class Callgrind(Server):
    """A server started under callgrind; counts its one worker between `zero` and `dump`."""

    def control(self, option: str) -> None:
        """callgrind_control, which exits 0 also when it finds no such process: its `OK.` is the answer."""
        done = subprocess.run(["callgrind_control", option, str(self.worker)], capture_output=True, text=True,
                              check=False)
        if "OK." not in done.stdout:
            raise RuntimeError(f"callgrind_control {option} {self.name}: {done.stdout.strip()} {done.stderr.strip()}")

    def zero(self) -> None:
        self.control("-z")

    def dump(self) -> Path:
        outputs = dumps_dir(self.log.parent, self.name)
        before = set(outputs.glob(f"{self.worker}.out.*"))
        self.control("-d")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            new = set(outputs.glob(f"{self.worker}.out.*")) - before
            if new:
                return max(new, key=lambda p: int(p.name.rsplit(".", 1)[1]))
            time.sleep(0.2)
        raise RuntimeError(f"callgrind wrote no dump for {self.name} (pid {self.worker})")

    @property
    def worker(self) -> int:
        (pid,) = self.workers()
        return pid


def callgrind_server(name: str, argv: list[str], tmp: Path, l2: str | None) -> Callgrind:
    """`l2`: callgrind's --LL option for this CPU's L2, or None (its own guess of the last level)."""
    port = free_port()
    outputs = dumps_dir(tmp, name)
    outputs.mkdir()
    # Without --trace-children=yes callgrind_control does not find the forked worker (valgrind 3.19).
    valgrind = ["valgrind", "--tool=callgrind", "--cache-sim=yes", "--branch-sim=yes", "--trace-children=yes",
                f"--callgrind-out-file={outputs}/%p.out", *([l2] if l2 else [])]
    return Callgrind(name, [*valgrind, *argv, "--bind", f"127.0.0.1:{port}", "--workers", "1",
                            "--threads", str(THREADS)], port, tmp / "ca.crt", tmp / f"{name}.log",
                     start_timeout=900)


class Connections:
    """CLIENTS keep-alive TLS connections to one server, reopened when the server closed one."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.context = ssl.create_default_context(cafile=str(server.ca_file))
        self.open = [self._connect() for _ in range(CLIENTS)]

    def _connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.server.port, context=self.context, timeout=600)

    def touch(self) -> None:
        """A request on every connection, reopening any the server closed, so none handshakes while counted."""
        for i, conn in enumerate(self.open):
            try:
                _get(conn, "/healthz")
            except (OSError, http.client.HTTPException):
                conn.close()
                self.open[i] = self._connect()
                _get(self.open[i], "/healthz")

    def send(self, path: str, datas: Sequence[bytes]) -> int:
        """Every body once, spread over the connections; the reviews answered 200."""
        def run(i: int) -> int:
            conn, answered = self.open[i], 0
            for data in datas[i::CLIENTS]:
                conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
                reply = conn.getresponse()
                reply.read()
                answered += reply.status == 200
            return answered

        with ThreadPoolExecutor(CLIENTS) as pool:
            return sum(pool.map(run, range(CLIENTS)))

    def close(self) -> None:
        for conn in self.open:
            conn.close()


def _get(conn: http.client.HTTPSConnection, path: str) -> None:
    conn.request("GET", path)
    reply = conn.getresponse()
    reply.read()
    if reply.status != 200:
        raise RuntimeError(f"GET {path}: {reply.status}")


Counts = dict[str, float]


def count(server: Callgrind, conns: Connections, path: str, datas: Sequence[bytes]) -> tuple[Counts, Counts, Counts]:
    """(events per review, FUNCTIONS' instructions per review, their L2 misses per review) of one pass of `datas`."""
    conns.touch()
    server.zero()
    answered = conns.send(path, datas)
    dump = server.dump()
    if answered != len(datas):
        raise RuntimeError(f"{server.name} {path}: {answered} of {len(datas)} reviews answered 200")
    events = dump_counts(dump.read_text(encoding="utf-8", errors="replace"))
    per_review = {column: sum(events.get(e, 0) for e in names) / answered for column, names in COLUMNS.items()}
    annotated = subprocess.run(["callgrind_annotate", "--inclusive=yes", f"--show={','.join(SHOWN)}",
                                "--threshold=100", str(dump)], capture_output=True, text=True, check=True).stdout
    found = inclusive(annotated, list(FUNCTIONS.values()))
    none = (0,) * len(SHOWN)
    instructions = {label: found.get(name, none)[0] / answered for label, name in FUNCTIONS.items()}
    l2_misses = {label: sum(found.get(name, none)[1:]) / answered for label, name in FUNCTIONS.items()}
    return per_review, instructions, l2_misses


def stamped(datas: Sequence[bytes], first: int) -> list[bytes]:
    """What bench/mix.lua sends: a serial of its own in every uid (and /validate pod name)."""
    return [bodies.stamp(data, serial) for serial, data in enumerate(datas, first)]


Rounds = list[tuple[Counts, Counts, Counts]]
TARGETS = (("allow-all", "validate"), ("/validate", "validate"), ("/mutate", "mutate"))


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def _ratios(rounds: Rounds, base: Rounds, column: str) -> list[float]:
    return [r[0][column] / b[0][column] if b[0][column] else 0.0 for r, b in zip(rounds, base, strict=True)]


def render(results: dict[str, dict[str, Rounds]], sizes: dict[str, int], rounds: int, machine: str, command: str,
           elapsed: float, l2: str | None) -> str:
    """`l2`: the --LL option that set callgrind's last level to this CPU's L2; None: no L2 column."""
    columns = [c for c in COLUMNS if l2 or c != L2]
    out = [BEGIN, "## Instructions per served review (callgrind)", "", provenance.stamp(command), "",
           f"* Command: `{command}` ({elapsed:.0f} s). {machine}.",
           "* Servers: the allow-all (bench/baseline_app.py) and `gpu-stack-webhook serve` with the policy the chart "
           f"renders for {bodies.MIX_VALUES.relative_to(REPO_ROOT)}, each one gunicorn worker of {THREADS} threads "
           "(the serve settings otherwise) under `valgrind --tool=callgrind`. Counted: every thread of the worker "
           "(gunicorn, TLS, the app), from the first request of a pass to its last answer.",
           f"* Load: per round and server, every body once over {CLIENTS} keep-alive TLS connections opened before "
           f"(no handshake counted): the pod mix ({sizes['the pod mix']:,} bodies, the shares of the HTTP part's "
           f"3,000) and one identical body ({sizes['one identical body']:,} times); the allow-all gets /validate's "
           f"bodies. {rounds} {'round' if rounds == 1 else 'rounds'}, the order reversed every other round. "
           "Figures per review: the median over the rounds; x allow-all: the median of each round's ratio.",
           "* Counts, not time: the HTTP part's CPU per review also pays for each miss and mispredicted branch in "
           "cycles, so its ratios to the allow-all can be larger than these. "
           + (f"L2 misses: callgrind's last level set to this CPU's L2 as sysfs describes it (`{l2}`): a line "
              "fetched from the L3 or memory. One simulated cache serves every thread of the worker."
              if l2 else "No L2 column: sysfs describes no L2 callgrind can simulate."), "",
           "| bodies | server | instructions per review | x allow-all | instructions x allow-all per round | "
           + " | ".join(f"{c} | x allow-all" for c in columns[1:]) + " |",
           "|---|---|---:|---:|---|" + "---:|---:|" * (len(columns) - 1)]
    for body, by_target in results.items():
        base = by_target["allow-all"]
        for target, _ in TARGETS:
            rows = by_target[target]
            cells = []
            for column in columns:
                cells.append(f"{_median([r[0][column] for r in rows]):,.0f}")
                ratio = f"{_median(_ratios(rows, base, column)):.3f}"
                cells.append(ratio)
                if column == "instructions":
                    cells.append(", ".join(f"{x:.3f}" for x in _ratios(rows, base, column)))
            out.append(f"| {body} | {target} | " + " | ".join(cells) + " |")
    headings = [(body, target) for body in results for target, _ in TARGETS if target != "allow-all"]
    out += ["", "Where the webhook's instructions go: its functions with everything they call, per review "
            "(callgrind_annotate --inclusive=yes; the review path is compiled by mypyc, so these are its C "
            "functions). The allow-all parses the same bodies with the same orjson.loads; the rest of each server's "
            "count is gunicorn, TLS and the interpreter.", ""]
    out += _function_table("instructions", results, headings, 1)
    if l2:
        out += ["", *_function_table("L2 misses", results, headings, 2)]
    out.append(END)
    return "\n".join(out) + "\n"


def _function_table(what: str, results: dict[str, dict[str, Rounds]], headings: list[tuple[str, str]],
                    index: int) -> list[str]:
    lines = [f"| function: {what} | " + " | ".join(f"{t}, {b}" for b, t in headings) + " | allow-all, the pod mix |",
             "|---|" + "---:|" * (len(headings) + 1)]
    for label in FUNCTIONS:
        values = [_median([r[index][label] for r in results[b][t]]) for b, t in headings]
        values.append(_median([r[index][label] for r in results["the pod mix"]["allow-all"]]))
        lines.append(f"| {label} | " + " | ".join(f"{v:,.0f}" if v else "-" for v in values) + " |")
    return lines


def machine() -> str:
    valgrind = subprocess.run(["valgrind", "--version"], capture_output=True, text=True, check=False).stdout.strip()
    cpu = run_bench.cpu_model() or platform.machine()
    return f"Machine: {cpu}, {platform.python_implementation()} {platform.python_version()}, {valgrind}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write the section into this file (BENCHMARKS.md)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="one round of 60 and 30 bodies (smoke test)")
    args = parser.parse_args(argv)
    ensure_tool("valgrind", "valgrind", "callgrind counts the instructions of the servers")
    rounds, mix, one = (1, 60, 30) if args.quick else (args.rounds, MIX, ONE_BODY)
    started = time.monotonic()
    l2 = l2_option()
    sets = {"the pod mix": {ep: [b.data for b in bodies.pod_mix(ep, mix)] for ep in bodies.ENDPOINTS},
            "one identical body": {ep: [bodies.gpu_pod_3c(ep).data] * one for ep in bodies.ENDPOINTS}}
    results: dict[str, dict[str, Rounds]] = {body: {t: [] for t, _ in TARGETS} for body in sets}
    with tempfile.TemporaryDirectory(prefix="gpu-stack-callgrind-") as tmp_name:
        tmp = Path(tmp_name)
        write_loopback_pki(tmp)
        policy = tmp / "policy.yaml"
        policy.write_text(chart_policy(bodies.MIX_VALUES))
        tls = ["--cert", str(tmp / "tls.crt"), "--key", str(tmp / "tls.key")]
        py = str(VENV_BIN / "python")
        base = callgrind_server("allow-all", [py, str(BENCH / "baseline_app.py"), *tls], tmp, l2)
        hook = callgrind_server("webhook", [py, str(VENV_BIN / "gpu-stack-webhook"), "serve", "--config", str(policy),
                                            *tls], tmp, l2)
        servers = {"allow-all": base, "/validate": hook, "/mutate": hook}
        conns: dict[str, Connections] = {}
        try:
            for server in (base, hook):
                server.start()
                conns[server.name] = Connections(server)
            serial = 1
            for ep in bodies.ENDPOINTS:  # warm-up: the first pass of each path is not counted
                for server in (base, hook):
                    conns[server.name].touch()
                    conns[server.name].send(f"/{ep}", stamped(sets["the pod mix"][ep][:50], serial))
                    serial += 50
            for i in range(rounds):
                for body, by_ep in sets.items():
                    for target, ep in TARGETS if i % 2 == 0 else TARGETS[::-1]:
                        server = servers[target]
                        datas = stamped(by_ep[ep], serial)
                        serial += len(datas)
                        results[body][target].append(count(server, conns[server.name], f"/{ep}", datas))
                        print(f"  round {i + 1} {body:18} {target:9} "
                              f"{results[body][target][-1][0]['instructions']:12,.0f} instructions per review",
                              flush=True)
            model = cache_model(next(dumps_dir(tmp, hook.name).glob("*.out.*")))
        finally:
            for c in conns.values():
                c.close()
            base.stop()
            hook.stop()
    command = "bench/served_instructions.py " + " ".join(argv if argv is not None else sys.argv[1:])
    section = render(results, {"the pod mix": mix, "one identical body": one}, rounds,
                     f"{machine()}; callgrind's simulated caches: {model}", command.strip(),
                     time.monotonic() - started, l2)
    print(section)
    if args.out:
        report.write_section(args.out, section, BEGIN, END)
    return 0
