"""`make bench`, pod creation through a real API server (issue 18): our webhooks vs a bare allow-all.

    .venv/bin/python bench/apiserver_load.py [--out BENCHMARKS.md] [--rounds 3] [--creates 1500] [--quick]
        [--part all|load|calls] [--calls-creates 1000] [--latency-creates 2000] [--calls-rounds 3]
        [--calls-concurrency 20] [--calls-rates 50]

The `make e2e` control plane (hack/controlplane.py: etcd + kube-apiserver + kube-controller-manager
v1.36) with the chart installed (default values). A ServiceAccount token POSTs two-container GPU pods
with `generateName` (tests/e2e/apiload.py), `--creates` per run at 50 and at 100 in flight. Targets
(bench/apiserver_rounds.py), every one in every round, the order rotated by one each round:

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

Second part (issue 25 item 6; bench/apiserver_calls.py), same control plane and release, configurations
pointed at our webhook: `--calls-creates` mixed creates (every 10th pod asks for a GPU, the rest none)
under (a) the chart's rendered configurations with every matchConditions removed and (b) as the chart
renders them, the webhook calls counted by the API server itself (`apiserver_admission_webhook_request_total`
by webhook name and type) per 1,000 creates; then creates of the pod without GPU with the configurations
as rendered (on), with no configurations at all (off) and with every matchCondition `false` (floor), the
ratio of the average latencies per round (target: within 5%), under two loads: closed loop (the
API server flat out) and paced at `--calls-rates` creates per second (Poisson arrivals, open loop).
Its own section, between its own markers. `--part load|calls` runs one part only.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import ssl
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_stack_dev.bench import apiserver_calls as calls_
from gpu_stack_dev.bench import apiserver_rounds as rounds_
from gpu_stack_dev.bench import many_clients, provenance
from gpu_stack_dev.bench.apiserver_rounds import BARE, BARE_ANSWERS, NONE, OURS, TARGETS, Run
from gpu_stack_dev.e2e import apiload, e2elib
from gpu_stack_dev.paths import ROOT

OPT_OUT = "gpu-stack.io/webhook"
SIZING = apiload.SIZING
QUIET_CORES = 0.15  # the control plane and the servers together, averaged over one window
QUIET_WINDOW = 0.5
SETTLE_LIMIT = 20.0
TICKS = os.sysconf("SC_CLK_TCK")
WEBHOOK_METRIC = "apiserver_admission_webhook_admission_duration_seconds"
HOOKS = ("mutate.gpu-stack.io", "validate.gpu-stack.io")
CONFIG_SETTLE = 3.0  # seconds after patching matchConditions before counting (set_conditions)
EXPECT = {BARE: "admitted", BARE_ANSWERS: "warned", OURS: "denied"}  # how each answers point_at's probe


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


def metric_sum(text: str, prefix: str, label: str = "") -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(prefix) and label in line)


class Snapshot:
    """What the API server and etcd counted so far (before and after a batch)."""

    def __init__(self, cluster: e2elib.E2ECluster, etcd: str) -> None:
        text = cluster.kubectl("get", "--raw", "/metrics").stdout
        self.calls = {h: metric_sum(text, f"{WEBHOOK_METRIC}_count{{", f'name="{h}"') for h in HOOKS}
        self.seconds = {h: metric_sum(text, f"{WEBHOOK_METRIC}_sum{{", f'name="{h}"') for h in HOOKS}
        self.gc = metric_sum(text, "go_gc_duration_seconds_count")
        etcd_text = ""
        if etcd:
            with urllib.request.urlopen(f"{etcd}/metrics", timeout=10) as reply:  # noqa: S310 (loopback)
                etcd_text = reply.read().decode()
        self.compactions = metric_sum(etcd_text, "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_count")


def settle(pids: list[int]) -> float:
    """Wait until the processes use less than QUIET_CORES over a window; seconds waited."""
    began = time.monotonic()
    while time.monotonic() - began < SETTLE_LIMIT:
        before = cpu_seconds(pids)
        time.sleep(QUIET_WINDOW)
        if (cpu_seconds(pids) - before) / QUIET_WINDOW < QUIET_CORES:
            break
    return time.monotonic() - began


# --- the webhooks ---------------------------------------------------------------------------------
def admission_review(namespace: str) -> dict[str, Any]:
    """The review the API server sends for the bench pod (requests defaulted from limits)."""
    pod = apiload.pod_body()
    pod["metadata"]["namespace"] = namespace
    for container in pod["spec"]["containers"]:
        container["resources"]["requests"] = dict(container["resources"]["limits"])
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": namespace,
        "operation": "CREATE", "userInfo": {"username": f"system:serviceaccount:{namespace}:{apiload.LOADER}"},
        "object": pod, "oldObject": None, "dryRun": False}}


def our_mutate_answer(hook: e2elib.LiveWebhook, namespace: str) -> dict[str, Any]:
    """What our /mutate answers for the bench pod, minus uid and allowed."""
    assert hook.pki is not None
    context = ssl.create_default_context(cafile=str(hook.pki.ca_cert))
    request = urllib.request.Request(f"https://127.0.0.1:{hook.port}/mutate", method="POST",
                                     data=json.dumps(admission_review(namespace)).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=context, timeout=10) as reply:  # noqa: S310 (loopback)
        response = json.load(reply)["response"]
    return {k: v for k, v in response.items() if k not in ("uid", "allowed")}


def point_at(cluster: e2elib.E2ECluster, hook: e2elib.LiveWebhook, release: e2elib.Release, namespace: str,
             expect: str) -> None:
    """Re-point the configurations at `hook` and wait until the API server calls it: a dry-run pod that
    ours denies ("denied"), the answering allow-all admits with its warning ("warned"), the bare
    allow-all admits without one ("admitted")."""
    apiload.repoint(cluster, hook, release)
    # A GPU pod: the webhook configurations' matchConditions send only what a rule can act on.
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bench-probe"},
             "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": 1}},
                                      "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}
    deadline = time.monotonic() + 60
    while True:
        proc = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(probe),
                               check=False)
        seen = ("denied" if "denied the request" in proc.stderr else "warned" if "Warning:" in proc.stderr
                else "admitted" if proc.returncode == 0 else proc.stderr)
        if seen == expect:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the API server did not switch to {expect!r}: {seen}")
        time.sleep(0.3)


# --- one batch ------------------------------------------------------------------------------------
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


# --- issue 25: webhook calls per 1,000 mixed creates, non-GPU latency with the webhook on and off -------
def webhook_configurations(cluster: e2elib.E2ECluster, release: e2elib.Release) -> list[dict[str, Any]]:
    return [obj for kind in e2elib.WEBHOOK_KINDS for obj in cluster.get_json(kind, "-l", release.selector)["items"]]


def patch_conditions(cluster: e2elib.E2ECluster, release: e2elib.Release, rendered: list[dict[str, Any]],
                     state: str) -> None:
    """Every configuration of the release with the matchConditions of `state`: AFTER or ON, those the chart
    rendered; BEFORE, none; FLOOR, the constant `false`."""
    # By kind and name: the chart names its mutating and validating configurations alike.
    by_name = {(obj["kind"], obj["metadata"]["name"]): obj for obj in rendered}
    for obj in webhook_configurations(cluster, release):
        patch = (calls_.without_conditions(obj) if state == calls_.BEFORE
                 else calls_.floor_conditions(obj) if state == calls_.FLOOR
                 else calls_.with_conditions(obj, by_name[obj["kind"], obj["metadata"]["name"]]))
        if patch:
            cluster.kubectl("patch", obj["kind"].lower(), obj["metadata"]["name"], "--type=json",
                            "-p", json.dumps(patch))


def set_conditions(cluster: e2elib.E2ECluster, release: e2elib.Release, rendered: list[dict[str, Any]],
                   keep: bool) -> None:
    """The release's configurations with the matchConditions the chart rendered (keep) or none at all."""
    patch_conditions(cluster, release, rendered, calls_.AFTER if keep else calls_.BEFORE)
    time.sleep(CONFIG_SETTLE)  # the API server's informer sees the change within this (see the notes)


def set_webhook(cluster: e2elib.E2ECluster, release: e2elib.Release, saved: list[dict[str, Any]], namespace: str,
                state: str) -> None:
    """No webhook configurations at all (OFF); the saved ones as the chart rendered them (ON, created again
    when deleted); or those with every matchCondition the constant `false` (FLOOR). Then wait until the API
    server acts on it: a dry-run GPU pod setting NVIDIA_VISIBLE_DEVICES is denied only when ON."""
    if state == calls_.FLOOR:
        # From ON (the API server has seen the configurations), so that an admitted probe below means the
        # `false` conditions are in effect rather than configurations not seen yet.
        set_webhook(cluster, release, saved, namespace, calls_.ON)
    current = webhook_configurations(cluster, release)
    if state == calls_.OFF:
        for obj in current:
            cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"])
    elif not current:
        keep = ("name", "labels", "annotations")
        fresh = [{**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k in keep}} for obj in saved]
        cluster.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": fresh}))
    if state != calls_.OFF:
        patch_conditions(cluster, release, saved, state)
    probe = apiload.pod_body()
    probe["metadata"] = {"name": "bench-switch-probe"}
    probe["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    deadline = time.monotonic() + 60
    while True:
        proc = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(probe),
                               check=False)
        if ("denied the request" in proc.stderr) if state == calls_.ON else proc.returncode == 0:
            if state == calls_.FLOOR:
                time.sleep(CONFIG_SETTLE)  # admitted from the first patched configuration: wait for the second
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the API server did not switch the webhook to {state}: {proc.stderr}")
        time.sleep(0.3)


def mixed_pod(index: int) -> dict[str, Any]:
    return apiload.pod_body(gpu=calls_.gpu_at(index))


def plain_pod(index: int) -> dict[str, Any]:
    return apiload.pod_body(gpu=False)


Calls = dict[tuple[str, str], float]


async def counted_batch(bench: Bench, namespace: str, total: int, concurrency: int,
                        pods: Callable[[int], dict[str, Any]], rate: float | None = None
                        ) -> tuple[apiload.LoadResult, Calls, float]:
    """Delete the namespace's pods, settle, a warm-up (one create per client, not counted), then `total`
    creates, closed loop with `concurrency` clients or, given a `rate`, paced at `rate` per second over
    `concurrency` connections; the webhook calls the API server counted during them, by (name, type), and
    the CPU seconds the API server spent meanwhile."""
    token = bench.tokens[namespace]
    async with apiload.session(bench.context, concurrency) as client:
        await delete_pods(client, bench.url, token, namespace)
        settle(bench.quiet_pids)
        await apiload.create_batch(client, bench.url, token, namespace, concurrency, concurrency, pods)
        before = calls_.parse_calls(bench.cluster.kubectl("get", "--raw", "/metrics").stdout, HOOKS)
        cpu = cpu_seconds([bench.pids["kube-apiserver"]])
        if rate is None:
            result = await apiload.create_batch(client, bench.url, token, namespace, total, concurrency, pods)
        else:
            result = await apiload.paced_batch(client, bench.url, token, namespace, total, rate, concurrency, pods)
        cpu = cpu_seconds([bench.pids["kube-apiserver"]]) - cpu
        after = calls_.parse_calls(bench.cluster.kubectl("get", "--raw", "/metrics").stdout, HOOKS)
    return result, calls_.delta(after, before), cpu


def measure_calls(bench: Bench, release: e2elib.Release, namespace: str, creates: int, latency_creates: int,
                  rounds: int, concurrency: int, rates: Sequence[float] = ()
                  ) -> tuple[list[calls_.CallsRun], list[calls_.LatencyRun], dict[str, int]]:
    """Issue 25 item 6, with the configurations already pointed at our webhook."""
    rendered = webhook_configurations(bench.cluster, release)  # as the chart made them (clientConfig re-pointed)
    calls: list[calls_.CallsRun] = []
    latency: list[calls_.LatencyRun] = []
    loads: list[tuple[str, float | None]] = [(calls_.CLOSED, None), *((calls_.paced(r), r) for r in rates)]
    for i in range(1, rounds + 1):
        for config in ((calls_.BEFORE, calls_.AFTER) if i % 2 else (calls_.AFTER, calls_.BEFORE)):
            set_conditions(bench.cluster, release, rendered, keep=config == calls_.AFTER)
            result, counted, _ = asyncio.run(counted_batch(bench, namespace, creates, concurrency, mixed_pod))
            run = calls_.CallsRun(round=i, config=config, creates=creates, created=result.created,
                                  gpu_pods=sum(calls_.gpu_at(n) for n in range(creates)), calls=counted,
                                  failures=dict(result.failures))
            calls.append(run)
            print(f"  calls round {i} {config:34} {result.created}/{creates} created; per 1,000 creates: "
                  + ", ".join(f"{name} {kind} {run.per_1000((name, kind)):.0f}" for name, kind in counted), flush=True)
        set_conditions(bench.cluster, release, rendered, keep=True)
        # Each state's creates as two batches in mirrored order (off, on, floor, floor, on, off; reversed
        # next round): the machine's speed drifts between batches by more than 5%, and a linear drift then
        # falls on every state alike.
        order = (calls_.OFF, calls_.ON, calls_.FLOOR)
        order = order if i % 2 else order[::-1]
        parts = {(state, load): calls_.LatencyRun(round=i, state=state, load=load)
                 for state in order for load, _ in loads}
        for state in (*order, *reversed(order)):
            set_webhook(bench.cluster, release, rendered, namespace, state)
            half = latency_creates // 2
            for load, rate in loads:
                result, _, cpu = asyncio.run(counted_batch(bench, namespace, half, concurrency, plain_pod, rate))
                part = parts[state, load]
                part.apiserver_cpu_s += cpu
                part.latencies_ms += [1000 * t for t in result.latencies]
                part.total += half
                for what, n in result.failures.items():
                    part.failures[what] = part.failures.get(what, 0) + n
                print(f"  latency round {i} {state:38} {load:22} {result.created}/{half} created, "
                      f"avg {result.mean_ms:.1f} ms, p99 {result.percentile_ms(99):.1f} ms", flush=True)
        latency += parts.values()
        set_webhook(bench.cluster, release, rendered, namespace, calls_.ON)
    return calls, latency, calls_.conditions_of(rendered)


class Bench:
    def __init__(self, plane: Any, cluster: e2elib.E2ECluster) -> None:
        self.cluster = cluster
        self.pids = plane_pids(plane)
        self.etcd = etcd_url(self.pids["kube-apiserver"])
        self.url, self.context = apiload.api_server(cluster)
        self.tokens: dict[str, str] = {}
        self.quiet_pids = list(self.pids.values())


@dataclass
class CallsPlan:
    creates: int = 1000
    latency_creates: int = 2000
    rounds: int = 3
    concurrency: int = 20
    # Paced loads besides the closed loop: creates per second sent whatever the answers. 50/s is a busy
    # cluster's controllers (a wide Job or a rollout); this API server does 500-700/s flat out.
    rates: tuple[float, ...] = (50.0,)


@dataclass
class CallsResult:
    calls: list[calls_.CallsRun]
    latency: list[calls_.LatencyRun]
    conditions: dict[str, int]
    seconds: float


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
            print("webhook calls per 1,000 mixed creates, and non-GPU creates with the webhook on / off (issue 25)",
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


def calls_notes(result: CallsResult, plan: CallsPlan) -> list[str]:
    return [f"Latency: {plan.latency_creates:,} creates of the pod without GPU per state and round, as two batches "
            "in mirrored order (off, on, floor, floor, on, off; reversed the next round) so that a drift of the "
            "machine's speed falls on every state alike, each batch after a warm-up; the ratio of the average "
            "latencies of the same round and load"
            + (f"; each batch once per load (closed loop, then paced at {', '.join(f'{r:g}' for r in plan.rates)} "
               "creates/s over the same number of connections)" if plan.rates else "")
            + ". Configurations switched by deleting them (off), "
            "creating them again as the chart rendered them (on), or patching every webhook's matchConditions to "
            "the constant `false` (floor), each time waiting until a dry-run GPU pod "
            f"setting NVIDIA_VISIBLE_DEVICES is denied (on) or admitted (off; floor, then {CONFIG_SETTLE:g} s more).",
            f"Between `before` and `after` the matchConditions are patched out or back in, then the bench waits "
            f"{CONFIG_SETTLE:g} s (the API server's informer applies a configuration change within milliseconds on "
            "loopback) and sends a warm-up batch before counting.",
            f"This part took {result.seconds:.0f} s."]


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
                        help="load: pod creation vs a bare allow-all (issue 18); calls: webhook calls per 1,000 "
                             "mixed creates and non-GPU latency on / off (issue 25); default: both")
    parser.add_argument("--calls-creates", type=int, default=CallsPlan.creates)
    parser.add_argument("--latency-creates", type=int, default=CallsPlan.latency_creates,
                        help="creates of the pod without GPU per state (webhook on / off) and round")
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
                e2elib.controlplane.connect(prepare=True) as plane:
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
