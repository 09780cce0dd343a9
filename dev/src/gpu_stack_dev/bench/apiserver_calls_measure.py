"""The second part of bench/apiserver_load.py measured: webhook calls per 1,000 mixed creates with and without
matchConditions, and the latency of pods without GPUs with the configurations on, off and all `false`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.samples import Sample

from gpu_stack_dev.bench import apiserver_calls as calls_
from gpu_stack_dev.bench.apiserver_metrics import MATCH_METRIC, WEBHOOK_METRIC, samples, total
from gpu_stack_dev.bench.apiserver_plane import Bench, cpu_seconds, delete_pods, settle
from gpu_stack_dev.bench.apiserver_webhooks import (
    CONFIG_SETTLE,
    HOOKS,
    declared_configurations,
    set_conditions,
    set_webhook,
    webhook_configurations,
)
from gpu_stack_dev.e2e import apiload, e2elib


def mixed_pod(index: int) -> dict[str, Any]:
    return apiload.pod_body(gpu=calls_.gpu_at(index))

def plain_pod(index: int) -> dict[str, Any]:
    """A pod without GPU; SANDBOXED_SHARE of them with a sandboxed runtimeClassName (gVisor, Kata)."""
    pod = apiload.pod_body(gpu=False)
    runtime_class = calls_.sandboxed_at(index)
    if runtime_class:
        pod["spec"]["runtimeClassName"] = runtime_class
    return pod


def ensure_sandboxes(bench: Bench) -> None:
    """The RuntimeClasses the sandboxed pods name, so the API server's RuntimeClass admission admits them."""
    items = [{"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name}, "handler": handler}
             for name, handler in sorted(calls_.SANDBOXES.items())]
    bench.cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

Calls = dict[tuple[str, str], float]

async def counted_batch(bench: Bench, namespace: str, total: int, concurrency: int,
                        pods: Callable[[int], dict[str, Any]], rate: float | None = None
                        ) -> tuple[apiload.LoadResult, Calls, float, float, float]:
    """Delete the namespace's pods, settle, a warm-up (one create per client, not counted), then `total`
    creates, closed loop with `concurrency` clients or, given a `rate`, paced at `rate` per second over
    `concurrency` connections; the webhook calls the API server counted during them, by (name, type), the
    CPU seconds the API server spent meanwhile, and the seconds it spent evaluating our webhooks'
    matchConditions and calling them."""
    token = bench.tokens[namespace]
    async with apiload.session(bench.context, concurrency) as client:
        await delete_pods(client, bench.url, token, namespace)
        settle(bench.quiet_pids)
        await apiload.create_batch(client, bench.url, token, namespace, concurrency, concurrency, pods)
        page = samples(bench.cluster.kubectl("get", "--raw", "/metrics").stdout)
        before, spent = calls_.parse_calls(page, HOOKS), _spent(page)
        cpu = cpu_seconds([bench.pids["kube-apiserver"]])
        if rate is None:
            result = await apiload.create_batch(client, bench.url, token, namespace, total, concurrency, pods)
        else:
            result = await apiload.paced_batch(client, bench.url, token, namespace, total, rate, concurrency, pods)
        cpu = cpu_seconds([bench.pids["kube-apiserver"]]) - cpu
        page = samples(bench.cluster.kubectl("get", "--raw", "/metrics").stdout)
        after, (match, called) = calls_.parse_calls(page, HOOKS), _spent(page)
    return result, calls_.delta(after, before), cpu, match - spent[0], called - spent[1]


def _spent(page: list[Sample]) -> tuple[float, float]:
    """The API server's seconds so far evaluating our webhooks' matchConditions, and calling them."""
    return total(page, f"{MATCH_METRIC}_sum", HOOKS), total(page, f"{WEBHOOK_METRIC}_sum", HOOKS)

def measure_calls(bench: Bench, release: e2elib.Release, namespace: str, creates: int, latency_creates: int,
                  rounds: int, concurrency: int, rates: Sequence[float] = ()
                  ) -> tuple[list[calls_.CallsRun], list[calls_.LatencyRun], dict[str, int]]:
    """Webhook calls per 1,000 mixed creates and non-GPU create latency, with the configurations already pointed
    at our webhook."""
    rendered = webhook_configurations(bench.cluster, release)  # as the chart made them (clientConfig re-pointed)
    saved = {calls_.DECLARED: declared_configurations(rendered)}
    calls: list[calls_.CallsRun] = []
    latency: list[calls_.LatencyRun] = []
    ensure_sandboxes(bench)
    loads: list[tuple[str, float | None]] = [(calls_.CLOSED, None), *((calls_.paced(r), r) for r in rates)]
    for i in range(1, rounds + 1):
        for config in ((calls_.BEFORE, calls_.AFTER) if i % 2 else (calls_.AFTER, calls_.BEFORE)):
            set_conditions(bench.cluster, release, rendered, keep=config == calls_.AFTER)
            result, counted, _, _, _ = asyncio.run(counted_batch(bench, namespace, creates, concurrency, mixed_pod))
            run = calls_.CallsRun(round=i, config=config, creates=creates, created=result.created,
                                  gpu_pods=sum(calls_.gpu_at(n) for n in range(creates)), calls=counted,
                                  failures=dict(result.failures))
            calls.append(run)
            print(f"  calls round {i} {config:34} {result.created}/{creates} created; per 1,000 creates: "
                  + ", ".join(f"{name} {kind} {run.per_1000((name, kind)):.0f}" for name, kind in counted), flush=True)
        set_conditions(bench.cluster, release, rendered, keep=True)
        # Each state's creates as two batches in mirrored order (off, on, declared, floor, floor, declared, on,
        # off; reversed next round): the machine's speed drifts between batches by more than 5%, and a linear
        # drift then falls on every state alike.
        order = (calls_.OFF, calls_.ON, calls_.DECLARED, calls_.FLOOR)
        order = order if i % 2 else order[::-1]
        parts = {(state, load): calls_.LatencyRun(round=i, state=state, load=load,
                                                  sandboxed_share=calls_.SANDBOXED_SHARE)
                 for state in order for load, _ in loads}
        for state in (*order, *reversed(order)):
            set_webhook(bench.cluster, release, saved.get(state, rendered), namespace, state)
            half = latency_creates // 2
            for load, rate in loads:
                result, _, cpu, match, called = asyncio.run(counted_batch(bench, namespace, half, concurrency,
                                                                          plain_pod, rate))
                part = parts[state, load]
                part.apiserver_cpu_s += cpu
                part.match_seconds += match
                part.call_seconds += called
                part.latencies_ms += [1000 * t for t in result.latencies]
                part.total += half
                for what, n in result.failures.items():
                    part.failures[what] = part.failures.get(what, 0) + n
                print(f"  latency round {i} {state:38} {load:22} {result.created}/{half} created, "
                      f"avg {result.mean_ms:.1f} ms, p99 {result.percentile_ms(99):.1f} ms", flush=True)
        latency += parts.values()
        set_webhook(bench.cluster, release, rendered, namespace, calls_.ON)
    return calls, latency, calls_.conditions_of(rendered)

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

def calls_notes(result: CallsResult, plan: CallsPlan) -> list[str]:
    return [f"Latency: {plan.latency_creates:,} creates of pods without GPU "
            f"({calls_.SANDBOXED_SHARE:.0%} of them sandboxed) per state and round, as two batches "
            "in mirrored order (off, on, declared, floor, floor, declared, on, off; reversed the next round) so that "
            "a drift of the "
            "machine's speed falls on every state alike, each batch after a warm-up; the ratio of the average "
            "latencies of the same round and load"
            + (f"; each batch once per load (closed loop, then paced at {', '.join(f'{r:g}' for r in plan.rates)} "
               "creates/s over the same number of connections)" if plan.rates else "")
            + ". Configurations switched by deleting them (off), "
            "creating them again as the chart rendered them (on), patching in the matchConditions the chart renders "
            "with `webhook.policy.nonGpuRuntimeClassNames` naming the sandboxes (declared), or patching every "
            "webhook's matchConditions to the constant `false` (floor), each time waiting until a dry-run GPU pod "
            f"setting NVIDIA_VISIBLE_DEVICES is denied (on, declared) or admitted (off; floor), then "
            f"{CONFIG_SETTLE:g} s more but for off.",
            f"Between `before` and `after` the matchConditions are patched out or back in, then the bench waits "
            f"{CONFIG_SETTLE:g} s (the API server's informer applies a configuration change within milliseconds on "
            "loopback) and sends a warm-up batch before counting.",
            f"This part took {result.seconds:.0f} s."]
