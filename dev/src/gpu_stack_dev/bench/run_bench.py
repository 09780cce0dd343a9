"""`make bench`, the HTTP part: the webhook as deployed vs an allow-all baseline, over TLS, with wrk.

    .venv/bin/python bench/run_bench.py [--out BENCHMARKS.md] [--quick] [--workers N --threads N]

What runs (all on 127.0.0.1, in a private network namespace when root so the TCP counters are ours):

* the webhook: `gpu-stack-webhook serve --config policy.yaml --cert --key --bind` with the policy the chart
  renders by default (gunicorn gthread, TLS with an ECDSA P-256 certificate from certs.py, keep-alive),
  workers/threads as deployed;
* the baseline: bench/baseline_app.py, a bare WSGI app that parses the body and allows, served by the
  same gunicorn settings (gunicorn_conf.settings) and the same certificate.

wrk (bench/mix.lua) replays bodies of bench/bodies.py over persistent TLS connections. The headline and
the targets: the pod mix (`bodies.pod_mix`: 3,000 pod CREATEs of 60 shapes, 70% without GPU, uid and
name unique per request), judged with the policy the chart renders for Chart-values-examples/
per-node-configs.yaml (exclusive, time-sliced, MPS and MIG nodes); beside it the same rounds on one
identical body (issue 14's 3-container GPU pod), the best case for the webhook's memos. Every
measurement alternates the servers (baseline, validate, mutate, baseline, ...) and reports the
median of the rounds, so a noisy neighbour hits all of them alike. Latency is measured at a fixed
offered rate (mix.lua paces sends on a schedule, see there), throughput closed loop at saturation.
CPU per review is the servers' utime+stime (master and workers, /proc/PID/stat) over the run divided
by the reviews answered; memory is VmRSS and PSS (smaps_rollup) of each worker after the load.
Connections: TCP passive opens of the namespace (/proc/net/snmp) during each run, i.e. TLS handshakes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.admission.pipeline import answer
from gpu_stack_webhook.policy.config import PolicyConfig, parse_config
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.policy.rules import RULES
from gpu_stack_webhook.settings import load_settings
from gpu_stack_webhook.tls.certs import write_loopback_pki

from gpu_stack_dev import paths
from gpu_stack_dev.bench import bodies, flamegraph, profile_summary, report
from gpu_stack_dev.paths import ROOT as REPO_ROOT

BENCH_DIR = paths.BENCH
VENV_BIN = Path(sys.executable).parent
LUA = BENCH_DIR / "mix.lua"
NETNS_ENV = "GPU_STACK_BENCH_NETNS"
TICKS = os.sysconf("SC_CLK_TCK")
SIZES = (1, 10, 50, 200)


@dataclass(frozen=True)
class Plan:
    rounds: int = 5
    warmup_s: int = 2
    saturation_s: int = 6
    # Each round gives a server its saturation_s as this many runs in mirrored order (see `alternate`).
    saturation_slices: int = 2
    saturation_connections: int = 32
    paced_rounds: int = 3
    paced_s: int = 8
    paced_rate: int = 1000
    paced_connections: int = 32
    size_rate: int = 50
    size_s: int = 6
    rules_rate: int = 200
    rules_s: int = 4
    profile_s: int = 8
    inprocess_number: int = 200

    @classmethod
    def quick(cls) -> Plan:
        return cls(rounds=2, warmup_s=1, saturation_s=2, paced_rounds=1, paced_s=2, size_s=2, rules_s=1,
                   profile_s=2, inprocess_number=20)


# --- processes and /proc --------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            text = (task / "children").read_text()
            out.extend(int(p) for p in text.split())
    return out


def _cpu_ticks(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat.rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of proc(5))


def _status_kb(pid: int, key: str) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _pss_kb(pid: int) -> int:
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


def chart_policy(values: Path | None = None) -> str:
    """The policy the chart serves (`helm template`, ConfigMap <release>-webhook-policy) with its default
    values plus `values`: what `helm install gpu-stack charts/gpu-stack [-f values]` runs, e.g. with
    injectRuntimeClassName: nvidia."""
    helm = subprocess.run([str(REPO_ROOT / "hack" / "ensure-helm.sh"), "3"], capture_output=True, text=True,
                          check=True).stdout.strip().splitlines()[-1]
    rendered = subprocess.run([helm, "template", "gpu-stack", str(REPO_ROOT / "charts" / "gpu-stack"),
                               *(["-f", str(values)] if values else [])],
                              capture_output=True, text=True, check=True).stdout
    for doc in yaml.safe_load_all(rendered):
        if doc and doc.get("kind") == "ConfigMap" and doc["metadata"]["name"].endswith("-webhook-policy"):
            return str(doc["data"]["policy.yaml"])
    raise RuntimeError("the chart rendered no webhook policy ConfigMap")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    name: str
    argv: list[str]
    port: int
    ca_file: Path
    log: Path
    expected_workers: int = 1
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log, cwd=REPO_ROOT)
        context = ssl.create_default_context(cafile=str(self.ca_file))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; log: {self.log}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as raw, \
                        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                    tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                    if tls.recv(64).startswith(b"HTTP/1.1 200") and len(self.workers()) >= self.expected_workers:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not answer /healthz within 60 s; log: {self.log}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def workers(self) -> list[int]:
        return _children(self.pid)

    def connections(self) -> dict[int, int]:
        """Established client connections per worker pid (see worker_connections)."""
        return worker_connections(self.pid, self.workers(), self.port)

    def cpu_ticks(self) -> int:
        return _cpu_ticks(self.pid) + sum(_cpu_ticks(w) for w in self.workers())

    def memory(self) -> dict[str, Any]:
        workers = self.workers()
        return {
            "master_rss_kb": _status_kb(self.pid, "VmRSS"),
            "master_pss_kb": _pss_kb(self.pid),
            "workers": [{"pid": w, "rss_kb": _status_kb(w, "VmRSS"), "pss_kb": _pss_kb(w)} for w in workers],
        }


# --- wrk ----------------------------------------------------------------------------------------------


def ensure_wrk() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("wrk not found: installing it with apt-get (Debian package `wrk`)", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], env=env, check=False,
                          stdout=subprocess.DEVNULL).returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], env=env, check=True, stdout=subprocess.DEVNULL)
            subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
        found = shutil.which("wrk")
        if found:
            return found
    sys.exit("make bench needs wrk (the HTTP load generator, https://github.com/wg/wrk): install it with "
             "`sudo apt-get install wrk` (Debian/Ubuntu) or your package manager, then run `make bench` again.")


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


# --- in-process sweeps ---------------------------------------------------------------------------------


def _median_us(fn: Callable[[], object], number: int, rounds: int = 7) -> float:
    return statistics.median(timeit.repeat(fn, number=number, repeat=rounds)) / number * 1e6


def inprocess_sizes(number: int) -> list[dict[str, Any]]:
    policy = Policy(PolicyConfig())
    rows = []
    for n in SIZES:
        review = bodies.scaled_pod("validate", n)
        data = json.dumps(review, separators=(",", ":")).encode()
        obj = review["request"]["object"]
        reps = max(3, number // n)
        evaluate = _median_us(lambda obj=obj: policy.evaluate(obj, "Pod"), reps)
        parse = _median_us(lambda data=data: json.loads(data), reps)
        full = _median_us(lambda data=data: answer(Endpoint.VALIDATE, data, policy).body, reps)
        rows.append({"containers": n, "bytes": len(data), "evaluate_us": evaluate, "json_loads_us": parse,
                     "review_us": full})
    return rows


def rules_config(enabled: int) -> dict[str, Any]:
    return {"rules": {"disabled": [r.id for r in RULES[enabled:]]}}


def inprocess_rules(number: int) -> list[dict[str, Any]]:
    mix = [json.loads(b.data) for b in bodies.mix("validate")]
    objects = [(m["request"]["object"], m["request"]["kind"]["kind"]) for m in mix]
    rows = []
    for k in range(1, len(RULES) + 1):
        policy = Policy(parse_config(rules_config(k)))

        def evaluate(policy: Policy = policy) -> None:
            for obj, kind in objects:
                policy.evaluate(obj, kind)

        rows.append({"rules": k, "ids": [r.id for r in RULES[:k]],
                     "evaluate_us": _median_us(evaluate, max(3, number // 5)) / len(objects)})
    return rows


def distinct_patches(mutate: list[bodies.Body], policy_text: str) -> int:
    """How many different JSONPatches the webhook answers over the /mutate bodies (in-process): the
    fewer, the more often its diff memo and last-encoded-patch cache hit in the mix."""
    policy = Policy(parse_config(yaml.safe_load(policy_text) or {}))
    patches = set()
    for body in mutate:
        response = json.loads(answer(Endpoint.MUTATE, bodies.stamp(body.data, 1), policy).body)["response"]
        if "patch" in response:
            patches.add(response["patch"])
    return len(patches)


# --- the run ---------------------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    wrk_version = subprocess.run(["wrk", "--version"], capture_output=True, text=True, check=False).stdout
    return {
        "nproc": str(os.cpu_count()),
        "cpu": model,
        "memory": f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
        "kernel": platform.release(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "wrk": (wrk_version.splitlines() or [""])[0].split(" Copyright")[0].strip(),
    }


def enter_netns() -> bool:
    """Re-run this script in a fresh network namespace (root only) so /proc/net/snmp counts only the
    bench's own connections. Returns True when already inside one."""
    if os.environ.get(NETNS_ENV) == "1":
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        return True
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return False
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        return False
    env = {**os.environ, NETNS_ENV: "1"}
    os.execvpe("unshare", ["unshare", "--net", sys.executable, *sys.argv], env)
    return False  # not reached


def profile_worker(server: Server, wrk: Wrk, manifest: Path, seconds: int, connections: int,
                   workdir: Path) -> dict[str, Any] | None:
    """py-spy --gil on every worker while wrk saturates the server; the stacks of all workers merged."""
    spy = shutil.which("py-spy", path=str(VENV_BIN)) or shutil.which("py-spy")
    if not spy:
        return {"skipped": "py-spy is not installed (pip install -r requirements.lock)"}
    recorders = []
    for worker in server.workers():
        raw = workdir / f"profile-{worker}.raw"
        recorders.append((raw, subprocess.Popen(
            [spy, "record", "--gil", "-p", str(worker), "-d", str(seconds), "-r", "200", "-f", "raw", "-o", str(raw)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
    time.sleep(0.5)
    with contextlib.suppress(RuntimeError):
        wrk.run("profile", server, manifest, seconds + 1, connections)
    texts = []
    for raw, rec in recorders:
        output = rec.communicate(timeout=60)[0].decode(errors="replace")
        if rec.returncode != 0 or not raw.is_file():
            return {"skipped": f"py-spy failed ({rec.returncode}): {output.strip()[-300:]}"}
        texts.append(raw.read_text())
    text = "\n".join(texts)
    busy, rows = profile_summary.summarise(text, 400)
    return {"busy_samples": busy, "inclusive": rows, "self": profile_summary.self_top(text, 12)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "BENCHMARKS.md")
    parser.add_argument("--json", type=Path, help="also write the raw results as JSON")
    parser.add_argument("--quick", action="store_true", help="one short round of everything (smoke test)")
    settings = load_settings()
    parser.add_argument("--workers", type=int, default=settings.workers)
    parser.add_argument("--threads", type=int, default=settings.threads)
    parser.add_argument("--no-profile", action="store_true", help="no py-spy flame graphs and profile")
    parser.add_argument("--flamegraphs", type=Path, default=BENCH_DIR / "flamegraphs",
                        help="where the py-spy SVGs go (linked from --out)")
    parser.add_argument("--no-rules", action="store_true", help="skip the rules sweep over HTTP (7 restarts)")
    args = parser.parse_args(argv)
    plan = Plan.quick() if args.quick else Plan()
    # SIGTERM unwinds like Ctrl-C, so the servers started below are stopped by their `finally`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    wrk_binary = ensure_wrk()
    in_netns = enter_netns()
    print("in-process policy micro-benchmark: hack/bench_policy.py", flush=True)
    policy_bench = subprocess.run(
        [sys.executable, str(REPO_ROOT / "hack" / "bench_policy.py"), *(["--rounds", "5"] if args.quick else [])],
        capture_output=True, text=True, check=True, cwd=REPO_ROOT).stdout
    print(policy_bench, flush=True)
    started = time.monotonic()
    print(f"gpu-stack HTTP benchmark: {args.workers} workers x {args.threads} threads, "
          f"{'private network namespace' if in_netns else 'host network namespace'}", flush=True)

    with tempfile.TemporaryDirectory(prefix="gpu-stack-bench-") as tmp_name:
        tmp = Path(tmp_name)
        write_loopback_pki(tmp)
        policy_file = tmp / "policy.yaml"
        policy_text = chart_policy(bodies.MIX_VALUES)
        policy_file.write_text(policy_text)
        manifests = {ep: bodies.write_manifest(bodies.mix(ep), tmp / "bodies", ep) for ep in bodies.ENDPOINTS}
        mixes = {ep: bodies.pod_mix(ep) for ep in bodies.ENDPOINTS}
        pod_mix = {ep: bodies.write_manifest(mixes[ep], tmp / "mix", f"mix-{ep}") for ep in bodies.ENDPOINTS}
        pod3 = {ep: bodies.write_manifest([bodies.gpu_pod_3c(ep)], tmp / "bodies", f"gpu-pod-3c-{ep}")
                for ep in bodies.ENDPOINTS}
        size_manifests = {
            n: bodies.write_manifest([bodies.Body(f"pod-{n}c", "/validate", bodies.scaled_pod("validate", n), True)],
                                     tmp / "bodies", f"size-{n}")
            for n in SIZES
        }
        tls = ["--cert", str(tmp / "tls.crt"), "--key", str(tmp / "tls.key")]
        sizing = ["--workers", str(args.workers), "--threads", str(args.threads)]

        def webhook(config: Path, port: int) -> Server:
            # The chart's default policy and the default log level: `serve` with no flags beyond the required ones.
            return Server("webhook", [str(VENV_BIN / "gpu-stack-webhook"), "serve", "--config", str(config), *tls,
                                      "--bind", f"127.0.0.1:{port}", *sizing],
                          port, tmp / "ca.crt", tmp / "webhook.log", expected_workers=args.workers)

        hook = webhook(policy_file, free_port())
        base_port = free_port()
        baseline = Server("baseline", [sys.executable, str(BENCH_DIR / "baseline_app.py"), *tls,
                                       "--bind", f"127.0.0.1:{base_port}", *sizing],
                          base_port, tmp / "ca.crt", tmp / "baseline.log", expected_workers=args.workers)
        wrk = Wrk(wrk_binary, tmp)
        results: dict[str, Any] = {"machine": machine(), "workers": args.workers, "threads": args.threads,
                                   "netns": in_netns, "plan": plan.__dict__, "bench_policy": policy_bench,
                                   "loadavg_before": os.getloadavg(),
                                   "mix": {**bodies.describe(mixes["validate"], mixes["mutate"]),
                                           "distinct_patches": distinct_patches(mixes["mutate"], policy_text)}}
        try:
            hook.start()
            baseline.start()
            results["memory_idle"] = {"webhook": hook.memory(), "baseline": baseline.memory()}
            # The bare allow-all gets the bodies /validate gets (its answer does not depend on the path).
            targets = [("baseline", baseline, pod_mix["validate"]), ("validate", hook, pod_mix["validate"]),
                       ("mutate", hook, pod_mix["mutate"])]
            same = [("baseline", baseline, pod3["validate"]), ("validate", hook, pod3["validate"]),
                    ("mutate", hook, pod3["mutate"])]
            print("warm-up", flush=True)
            for name, server, manifest in [*targets, *same]:
                wrk.run(name, server, manifest, plan.warmup_s, plan.saturation_connections)

            print(f"saturation (closed loop, {plan.saturation_connections} keep-alive connections, the pod mix: "
                  f"{len(mixes['validate']):,} bodies of {len(bodies.SHAPES)} shapes)", flush=True)
            results["saturation"] = alternate(wrk, targets, plan.rounds, plan.saturation_s,
                                              plan.saturation_connections, slices=plan.saturation_slices)
            print(f"saturation (closed loop, {plan.saturation_connections} keep-alive connections, one identical "
                  "body: the 3-container GPU pod x 20 env vars)", flush=True)
            results["saturation_same"] = alternate(wrk, same, plan.rounds, plan.saturation_s,
                                                   plan.saturation_connections, slices=plan.saturation_slices)
            print(f"fixed rate {plan.paced_rate}/s ({plan.paced_connections} connections, /validate, the pod mix)",
                  flush=True)
            results["paced"] = alternate(wrk, targets[:2], plan.paced_rounds, plan.paced_s, plan.paced_connections,
                                         plan.paced_rate)
            results["memory_loaded"] = {"webhook": hook.memory(), "baseline": baseline.memory()}

            print(f"pod size sweep ({plan.size_rate}/s, /validate)", flush=True)
            results["sizes"] = {}
            for n, manifest in size_manifests.items():
                results["sizes"][n] = alternate(
                    wrk, [("baseline", baseline, manifest), ("validate", hook, manifest)], 1, plan.size_s, 8,
                    plan.size_rate)
            results["memory_after"] = {"webhook": hook.memory(), "baseline": baseline.memory()}
            if not args.no_profile:
                results["flamegraphs"] = {}
                for ep in bodies.ENDPOINTS:
                    svg = args.flamegraphs / f"{ep}.svg"
                    print(f"flame graph: py-spy --gil on both workers, /{ep} at saturation, {plan.profile_s} s "
                          f"-> {svg}", flush=True)
                    results["flamegraphs"][ep] = {
                        "svg": svg, "skipped": flamegraph.record(hook, wrk, pod_mix[ep], plan.profile_s,
                                                                 plan.saturation_connections, svg)}
                print(f"profile: py-spy --gil on the workers, /validate at saturation, {plan.profile_s} s",
                      flush=True)
                results["profile"] = profile_worker(hook, wrk, pod_mix["validate"], plan.profile_s,
                                                    plan.saturation_connections, tmp)
        finally:
            hook.stop()
            baseline.stop()

        results["rules"] = []
        if not args.no_rules:
            print(f"rules sweep over HTTP ({plan.rules_rate}/s, /validate mix, one server per rule count)",
                  flush=True)
            for k in range(1, len(RULES) + 1):
                config = tmp / f"policy-{k}.json"
                config.write_text(json.dumps(rules_config(k)))
                server = webhook(config, free_port())
                try:
                    server.start()
                    wrk.run("warmup", server, manifests["validate"], 1, 8)
                    summary = alternate(wrk, [("validate", server, manifests["validate"])], 1, plan.rules_s, 8,
                                        plan.rules_rate)
                    results["rules"].append({"rules": k, "summary": summary["validate"]})
                finally:
                    server.stop()

        print("in-process sweeps (pod size, rule count)", flush=True)
        results["inprocess_sizes"] = inprocess_sizes(plan.inprocess_number)
        results["inprocess_rules"] = inprocess_rules(plan.inprocess_number)
        results["elapsed_s"] = time.monotonic() - started
        results["loadavg_after"] = os.getloadavg()

    text = report.render(results, " ".join(["make bench" if not argv and not sys.argv[1:] else
                                             "bench/run_bench.py " + " ".join(sys.argv[1:])]),
                         args.out.resolve().parent)
    old = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
    args.out.write_text(report.keep_sections(old, text), encoding="utf-8")
    print()
    print(text)
    if args.json:
        args.json.write_text(json.dumps(results, default=lambda o: str(o) if isinstance(o, Path) else o.__dict__,
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
