"""`make bench`, pod creation through a real API server: our webhooks vs a bare allow-all.

    .venv/bin/python bench/apiserver_load.py [--out BENCHMARKS.md] [--rounds 3] [--creates 1500] [--quick]
        [--part all|load|calls] [--calls-creates 1000] [--latency-creates 2000] [--calls-rounds 3]
        [--calls-concurrency 20] [--calls-rates 50]

The `make e2e` control plane (hack/controlplane.py: etcd + kube-apiserver + kube-controller-manager
v1.36) with the chart installed (default values). A ServiceAccount token POSTs two-container GPU pods
with `generateName` (gpu_stack_dev.e2e.apiload), `--creates` per run at 50 and at 100 in flight. Targets
(gpu_stack_dev.bench.apiserver_rounds), every one in every round, the order rotated by one each round:

* `no webhook`: a namespace labelled with the chart's opt-out label, so the API server calls nothing;
* `bare allow-all`: the release's two webhook configurations pointed at bench/baseline_app.py;
* `bare, our answers`: the same app answering /mutate with what our webhook answers for this pod
  (asked once at the start), so the API server's cost of applying our mutation is seen apart;
* `gpu-stack webhook`: the configurations pointed at `gpu-stack-webhook serve` (2 workers x 4
  threads, as deployed), serving the release's own policy.

The three servers start once and serve the whole bench (loopback, loopback PKI). The configurations are
re-pointed once per target and round. Every batch, on one keep-alive client session: delete the pods
of the namespace (DELETE collection, unscheduled pods go at once), wait until etcd, the API server, the
controller manager and the webhook servers are quiet (CPU from /proc), a warm-up batch of one create per
client (not counted), then the measured batch. Recorded per batch: the machine's load average, CPU of
the API server / etcd / webhook server from /proc, webhook calls per pod, Go GC cycles of the API server
(its /metrics) and etcd compactions (etcd's /metrics). The section is written into --out between
markers, replacing the previous one.

Second part (gpu_stack_dev.bench.apiserver_calls), same control plane and release, configurations
pointed at our webhook: `--calls-creates` mixed creates (every 10th pod asks for a GPU, the rest none)
under (a) the chart's rendered configurations with every matchConditions removed and (b) as the chart
renders them, the webhook calls counted by the API server itself (`apiserver_admission_webhook_request_total`
by webhook name and type) per 1,000 creates; then creates of pods without GPU, one in 20 with a sandboxed
runtimeClassName (gVisor, Kata: apiserver_calls.SANDBOXED_SHARE; the chart's matchConditions send those to the
webhook unless webhook.policy.nonGpuRuntimeClassNames names them), with the configurations as rendered (on), with
the conditions rendered with those names declared (declared), with no configurations at all (off) and with every
matchCondition `false` (floor), the ratio of the average latencies per round (target: on, and declared, within 5%
of the floor), under two loads: closed loop (the
API server flat out) and paced at `--calls-rates` creates per second (Poisson arrivals, open loop).
Its own section, between its own markers. `--part load|calls` runs one part only.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpu_stack_dev import controlplane
from gpu_stack_dev.bench import apiserver_calls as calls_
from gpu_stack_dev.bench import apiserver_rounds as rounds_
from gpu_stack_dev.bench import many_clients, provenance
from gpu_stack_dev.bench.apiserver_calls_measure import CallsPlan, CallsResult, calls_notes, measure_calls
from gpu_stack_dev.bench.apiserver_plane import (
    Bench,
    Snapshot,
    closed_connections,
    cpu_seconds,
    delete_pods,
    settle,
    watch_closed,
)
from gpu_stack_dev.bench.apiserver_rounds import BARE, BARE_ANSWERS, NONE, OURS, TARGETS, Run
from gpu_stack_dev.bench.apiserver_webhooks import EXPECT, HOOKS, OPT_OUT, our_mutate_answer, point_at
from gpu_stack_dev.e2e import apiload, e2elib
from gpu_stack_dev.paths import ROOT

SIZING = apiload.SIZING


# --- one batch ------------------------------------------------------------------------------------


async def one_batch(bench: Bench, run: Run, namespace: str, hook: e2elib.LiveWebhook | None) -> None:
    hook_pids = [hook.process.pid] if hook is not None and hook.process else []
    token = bench.tokens[namespace]
    async with apiload.session(bench.context, run.concurrency) as client:
        await delete_pods(client, bench.url, token, namespace)
        run.settle_s = settle(bench.quiet_pids)
        before = Snapshot(bench.cluster, bench.etcd)
        run.load1 = os.getloadavg()[0]
        warm = await apiload.create_batch(client, bench.url, token, namespace, run.concurrency, run.concurrency)
        cpu = {"api": cpu_seconds([bench.pids["kube-apiserver"]]), "etcd": cpu_seconds([bench.pids["etcd"]]),
               "hook": cpu_seconds(hook_pids) if hook_pids else 0.0}
        before_batch = closed_connections(hook.port) if hook is not None else set()
        closed: set[tuple[int, int]] = set()
        watcher = asyncio.create_task(watch_closed(hook.port, closed)) if hook is not None else None
        result = await apiload.create_batch(client, bench.url, token, namespace, run.total, run.concurrency)
        spent = {"api": cpu_seconds([bench.pids["kube-apiserver"]]) - cpu["api"],
                 "etcd": cpu_seconds([bench.pids["etcd"]]) - cpu["etcd"],
                 "hook": (cpu_seconds(hook_pids) - cpu["hook"]) if hook_pids else 0.0}
        if watcher is not None and hook is not None:
            watcher.cancel()
            closed |= closed_connections(hook.port)
        closed -= before_batch
    after = Snapshot(bench.cluster, bench.etcd)
    run.latencies_ms = [1000 * t for t in result.latencies]
    run.failures = result.failures
    run.seconds = result.seconds
    per_pod = 1000 / max(1, result.created)
    run.apiserver_cpu_ms, run.etcd_cpu_ms, run.webhook_cpu_ms = (spent[k] * per_pod for k in ("api", "etcd", "hook"))
    judged = max(1, warm.created + result.created)  # the snapshots span the warm-up batch too
    calls = {h: after.calls[h] - before.calls[h] for h in HOOKS}
    run.calls = {h: calls[h] / judged for h in HOOKS} if hook_pids else {}
    run.call_ms = {h: 1000 * (after.seconds[h] - before.seconds[h]) / calls[h] for h in HOOKS if calls[h]}
    run.closed_per_100 = 100 * len(closed) / max(1, result.created)
    run.gc_cycles = round(after.gc - before.gc)
    run.compactions = round(after.compactions - before.compactions)


def measure(plane: Any, tmp: Path, creates: int, rounds: int, concurrencies: list[int],
            targets: tuple[str, ...], calls_plan: CallsPlan | None = None
            ) -> tuple[list[Run], dict[str, Any], CallsResult | None]:
    cluster = e2elib.E2ECluster.from_controlplane(plane, tmp / "helm-home")
    releases = e2elib.Releases(cluster)
    ours = e2elib.LiveWebhook(cluster, tmp / "webhook")
    bare = apiload.BareWebhook(cluster, tmp / "bare")
    answering = apiload.BareWebhook(cluster, tmp / "bare-answers")
    runs: list[Run] = []
    calls_result = None
    try:
        release, _ = releases.install()
        judged = cluster.create_namespace()
        skipped = cluster.create_namespace(labels={OPT_OUT: "disabled"})
        bench = Bench(plane, cluster)
        bench.tokens = {ns: apiload.loader_token(cluster, ns) for ns in (judged, skipped)}
        ours.start(release, extra_args=SIZING)
        answer = our_mutate_answer(ours, judged)
        answering.baseline_args = ("--mutate-answer", json.dumps(answer))
        bare.start()
        answering.start()
        hooks: dict[str, e2elib.LiveWebhook | None] = {NONE: None, BARE: bare, BARE_ANSWERS: answering, OURS: ours}
        bench.quiet_pids += [h.process.pid for h in (ours, bare, answering) if h.process]
        for i in range(rounds):
            for position, target in enumerate(rounds_.rotation(targets, i), 1):
                hook = hooks[target]
                if hook is not None:
                    point_at(cluster, hook, release, judged, EXPECT[target])
                namespace = judged if hook is not None else skipped
                for concurrency in (concurrencies if i % 2 == 0 else concurrencies[::-1]):
                    run = Run(round=i + 1, position=position, target=target, concurrency=concurrency, total=creates)
                    asyncio.run(one_batch(bench, run, namespace, hook))
                    runs.append(run)
                    print(f"  round {i + 1}.{position} {target:18} {concurrency:3} in flight: "
                          f"{run.created}/{run.total}, "
                          f"avg {run.avg_ms:.0f} ms, p99 {run.percentile_ms(99):.0f} ms, load {run.load1:.1f}, "
                          f"settle {run.settle_s:.1f} s, API server {run.apiserver_cpu_ms:.2f} ms/pod"
                          + (f", failures {dict(run.failures.most_common(2))}" if run.failures else ""), flush=True)
        if calls_plan is not None:
            print("webhook calls per 1,000 mixed creates, and non-GPU creates with the webhook on / off",
                  flush=True)
            began = time.monotonic()
            point_at(cluster, ours, release, judged, EXPECT[OURS])
            calls, latency, conditions = measure_calls(bench, release, judged, calls_plan.creates,
                                                       calls_plan.latency_creates, calls_plan.rounds,
                                                       calls_plan.concurrency, calls_plan.rates)
            calls_result = CallsResult(calls, latency, conditions, time.monotonic() - began)
    finally:
        for hook in (ours, bare, answering):
            hook.stop()
        releases.cleanup()
    return runs, answer, calls_result


def notes(answer: dict[str, Any], seconds: float) -> list[str]:
    patch = base64.b64decode(answer["patch"]).decode() if "patch" in answer else "none"
    return [f"Our /mutate answer for this pod (replayed by `bare, our answers`): patch {patch}, "
            f"warnings {answer.get('warnings', [])}, auditAnnotations {answer.get('auditAnnotations', {})}.",
            "Between batches the API server also runs its periodic work (kube-apiserver defaults): an etcd "
            "compaction every 5 min, an object count per resource every 1 min, the etcd DB size every 30 s; "
            "`compactions` and `GC cycles` in the table of every run show where they fell.",
            "`webhook conns closed`: connections to the webhook server that entered TIME-WAIT during the batch. "
            "The API server speaks HTTP/1.1 to both servers (neither offers h2 in ALPN) and keeps at most 25 "
            "idle connections per webhook host (client-go's transport cache), so at 50-100 in flight it "
            "re-dials, each time a full TLS 1.3 handshake.",
            f"The bench took {seconds:.0f} s."]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--creates", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3, help="3 in `make bench`; 5 for a sign-off run")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[50, 100])
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS, metavar="TARGET",
                        help=f"among {', '.join(map(repr, TARGETS))} (default: all)")
    parser.add_argument("--save-runs", type=Path, help="also write every run's raw figures here (JSON)")
    parser.add_argument("--from-runs", type=Path, help="measure nothing: render the runs --save-runs wrote")
    parser.add_argument("--quick", action="store_true", help="one round of 200 creates (smoke test)")
    parser.add_argument("--part", choices=("all", "load", "calls"), default="all",
                        help="load: pod creation vs a bare allow-all; calls: webhook calls per 1,000 "
                             "mixed creates and non-GPU latency on / off; default: both")
    parser.add_argument("--calls-creates", type=int, default=CallsPlan.creates)
    parser.add_argument("--latency-creates", type=int, default=CallsPlan.latency_creates,
                        help="creates of pods without GPU (one in 20 sandboxed) per state (on / off / floor) and round")
    parser.add_argument("--calls-rounds", type=int, default=CallsPlan.rounds)
    parser.add_argument("--calls-concurrency", type=int, default=CallsPlan.concurrency)
    parser.add_argument("--calls-rates", type=float, nargs="*", default=list(CallsPlan.rates), metavar="PER_S",
                        help="paced loads measured besides the closed loop (creates per second; none: closed only)")
    args = parser.parse_args(argv)
    calls_result: CallsResult | None = None
    calls_plan: CallsPlan | None = None
    stamp = command = ""
    if args.from_runs:
        runs, meta = rounds_.load(args.from_runs)
    else:
        creates, rounds = (200, 1) if args.quick else (args.creates, args.rounds)
        calls_plan = (CallsPlan(creates=args.calls_creates, latency_creates=300 if args.quick else args.latency_creates,
                                rounds=1 if args.quick else args.calls_rounds, concurrency=args.calls_concurrency,
                                rates=tuple(args.calls_rates))
                      if args.part != "load" else None)
        measured_targets = tuple(args.targets) if args.part != "calls" else ()
        given = argv if argv is not None else sys.argv[1:]
        command = "make bench" if not given else "bench/apiserver_load.py " + " ".join(given)
        stamp = provenance.stamp(command)  # the checkout measured, before the run writes anything
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="gpu-stack-apiload-") as tmp_name, \
                controlplane.connect(prepare=True) as plane:
            runs, answer, calls_result = measure(plane, Path(tmp_name), creates, rounds, args.concurrency,
                                                 measured_targets, calls_plan)
        meta = {"command": command, "stamp": stamp,
                "creates": creates, "rounds": rounds, "concurrencies": args.concurrency, "targets": args.targets,
                "answer": answer, "seconds": time.monotonic() - started}
        if args.save_runs:
            rounds_.save(runs, args.save_runs, meta)
    if runs:
        section = rounds_.render(runs, command=meta["command"], creates=meta["creates"], rounds=meta["rounds"],
                                 concurrencies=meta["concurrencies"], targets=meta["targets"],
                                 notes=notes(meta["answer"], meta["seconds"]), stamp=meta.get("stamp", ""))
        many_clients.write_section(args.out, section, rounds_.BEGIN, rounds_.END)
        print(section)
    if not args.from_runs and calls_result is not None and calls_plan is not None:
        calls_section = calls_.render(calls_result.calls, calls_result.latency, stamp=stamp, command=command,
                                      conditions=calls_result.conditions, concurrency=calls_plan.concurrency,
                                      notes=calls_notes(calls_result, calls_plan))
        many_clients.write_section(args.out, calls_section, calls_.BEGIN, calls_.END)
        print(calls_section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
