"""`make bench`, the HTTP part: the webhook as deployed vs an allow-all baseline, over TLS, with wrk.

    .venv/bin/python bench/run_bench.py [--out BENCHMARKS.md] [--quick] [--workers N --threads N]

What runs (all on 127.0.0.1, in a private network namespace when root so the TCP counters are ours):

* the webhook: `gpu-stack-webhook serve --config policy.yaml --cert --key --bind` with the policy the chart
  renders by default (gunicorn gthread, TLS with an ECDSA P-256 certificate from certs.py, keep-alive),
  workers/threads as deployed;
* the baseline: bench/baseline_app.py, a bare WSGI app that parses the body and allows, served by the
  same gunicorn settings (gunicorn_conf.settings) and the same certificate.

wrk (bench/mix.lua) replays bodies of gpu_stack_dev.bench.bodies over persistent TLS connections. The headline and
the targets: the pod mix (`bodies.pod_mix`: 3,000 pod CREATEs of 60 shapes, 70% without GPU, uid and
name unique per request), judged with the policy the chart renders for Chart-values-examples/
per-node-configs.yaml (exclusive, time-sliced, MPS and MIG nodes); beside it the same rounds on one
identical body (bodies.gpu_pod_3c, a 3-container GPU pod), the best case for the webhook's memos. Every
measurement alternates the servers (baseline, validate, mutate, baseline, ...) and reports the
median of the rounds, so a noisy neighbour hits all of them alike. Latency is measured at a fixed
offered rate (mix.lua paces sends on a schedule, see there), throughput closed loop at saturation.
CPU per review is the servers' utime+stime (master and workers, /proc/PID/stat) over the run divided
by the reviews answered; memory is VmRSS and PSS (smaps_rollup) of each worker after the load.
Connections: TCP passive opens of the namespace (/proc/net/snmp) during each run, i.e. TLS handshakes.
Profile: py-spy flame graphs of /validate and /mutate on both bodies (flamegraph.py), and the share of each layer
of the served path per review for every server and body (layers.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_stack_webhook.policy.rules import RULES
from gpu_stack_webhook.settings import load_settings
from gpu_stack_webhook.tls.certs import write_loopback_pki

from gpu_stack_dev import paths
from gpu_stack_dev.bench import bodies, flamegraph, layers, report, report_http
from gpu_stack_dev.bench.inprocess import SIZES, distinct_patches, inprocess_rules, inprocess_sizes, rules_config
from gpu_stack_dev.bench.servers import VENV_BIN, Server, chart_policy, ensure_wrk, free_port
from gpu_stack_dev.bench.wrk import Wrk, alternate
from gpu_stack_dev.paths import ROOT as REPO_ROOT

BENCH_DIR = paths.BENCH
NETNS_ENV = "GPU_STACK_BENCH_NETNS"


@dataclass(frozen=True)
class Plan:
    rounds: int = 5
    warmup_s: int = 2
    saturation_s: int = 6
    # Each round gives a server its saturation_s as this many runs in mirrored order (see `alternate`): runs of 1 s,
    # so that a burst of other work on the shared machine falls on all three servers of a round, not on one.
    saturation_slices: int = 6
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
        return cls(rounds=2, warmup_s=1, saturation_s=2, saturation_slices=2, paced_rounds=1, paced_s=2, size_s=2,
                   rules_s=1, profile_s=2, inprocess_number=20)


# --- processes and /proc --------------------------------------------------------------------------


# --- wrk ----------------------------------------------------------------------------------------------


# --- in-process sweeps ---------------------------------------------------------------------------------


# --- the run ---------------------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), "" where it is not said."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return ""


def machine() -> dict[str, str]:
    model = cpu_model()
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
                for label, manifests_of in (("", pod_mix), ("-one-body", pod3)):
                    for ep in bodies.ENDPOINTS:
                        svg = args.flamegraphs / f"{ep}{label}.svg"
                        print(f"flame graph: py-spy --gil --native on both workers, /{ep} at saturation "
                              f"({'one identical body' if label else 'the pod mix'}), {plan.profile_s} s -> {svg}",
                              flush=True)
                        results["flamegraphs"][f"{ep}{label}"] = {
                            "svg": svg, "skipped": flamegraph.record(hook, wrk, manifests_of[ep], plan.profile_s,
                                                                     plan.saturation_connections, svg)}
                print(f"layers: py-spy --native on the workers at saturation, {plan.profile_s} s per server and body",
                      flush=True)
                results["layers"] = {
                    f"{body}/{name}": layers.record(server, wrk, manifest, plan.profile_s,
                                                    plan.saturation_connections, tmp, f"{body}-{name}")
                    for body, group in (("mix", targets), ("one", same)) for name, server, manifest in group}
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

    text = report_http.render(results, " ".join(["make bench" if not argv and not sys.argv[1:] else
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
