"""The bookkeeping of bench/apiserver_load.py's second part, free of clusters and clocks:
webhook calls per 1,000 mixed pod creates read from the API server's own counter, for the chart's
webhook configurations without and with their `matchConditions`, and the create latency of pods without
GPU with the webhook on vs off; the Markdown section written into BENCHMARKS.md."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.samples import Sample

from gpu_stack_dev.bench.apiserver_metrics import MATCH_METRIC, WEBHOOK_METRIC
from gpu_stack_dev.bench.apiserver_rounds import Latencies

BEGIN = "<!-- apiserver-calls:begin (bench/apiserver_load.py) -->"
END = "<!-- apiserver-calls:end -->"
CALL_METRIC = "apiserver_admission_webhook_request_total"
GPU_SHARE = 0.10  # of the mixed creates: 90% of pods ask for no GPU
# Of the non-GPU creates whose latency is judged: pods with a sandboxed runtimeClassName, which the chart's
# matchConditions send to the webhook (every pod naming a RuntimeClass is, since its handler decides whether it is
# a GPU pod) unless webhook.policy.nonGpuRuntimeClassNames names it (DECLARED). One pod
# in 20: a sandbox (gVisor, Kata) is what a cluster gives its untrusted or multi-tenant workloads (CI jobs,
# notebooks, user functions), beside a majority of ordinary runc pods (system daemons, services).
SANDBOXED_SHARE = 0.05
# RuntimeClass name -> handler: gVisor's runsc and Kata's, as their installers name them; the bench creates
# them so the API server's RuntimeClass admission admits the pods (nothing runs them: no node).
SANDBOXES = {"gvisor": "runsc", "kata": "kata"}
LATENCY_RATIO = 1.05  # non-GPU creates with the webhook on / the matchConditions floor: within 5%
BEFORE = "before: no matchConditions"
AFTER = "after: as the chart renders them"
ON, OFF = "webhook on (as the chart renders)", "webhook off (no configurations)"
# ON with the sandboxes declared non-GPU (webhook.policy.nonGpuRuntimeClassNames naming SANDBOXES): the
# chart's matchConditions then leave the sandboxed pods out.
DECLARED = "webhook on, sandboxes declared (`nonGpuRuntimeClassNames`)"
# The configurations present, each webhook's matchConditions the constant `false`: the API server calls
# nothing, as with OFF, but pays what evaluating any matchConditions costs it (the object and request
# turned into CEL values per webhook), which no cheaper expression can save.
FLOOR = "floor (every matchCondition `false`)"
# How the creates are sent. CLOSED: `concurrency` clients, each sending its next create when the last is
# answered, so the API server runs flat out and a create's latency grows with its CPU per create. A paced
# load (`paced(rate)`): creates sent at a fixed rate whatever the answers (Poisson arrivals), as
# controllers send them on a cluster whose API server has headroom.
CLOSED = "closed loop"


def paced(rate: float) -> str:
    return f"paced, {rate:g} creates/s"


def gpu_at(index: int, share: float = GPU_SHARE) -> bool:
    """Whether create number `index` of a mixed batch asks for a GPU: evenly spread, `share` of them
    (every 10th for 10%), so any 1,000 consecutive creates hold the same number of GPU pods."""
    return int((index + 1) * share) > int(index * share)


def parse_calls(page: Sequence[Sample], names: Sequence[str]) -> dict[tuple[str, str], float]:
    """CALL_METRIC summed by (webhook name, type) over its other labels (code, operation, rejected), for
    the webhooks in `names`, from the samples of the API server's /metrics (apiserver_metrics.samples)."""
    out: dict[tuple[str, str], float] = {}
    for sample in page:
        if sample.name == CALL_METRIC and sample.labels.get("name") in names:
            key = (sample.labels["name"], sample.labels.get("type", "?"))
            out[key] = out.get(key, 0.0) + sample.value
    return out


def delta(after: Mapping[tuple[str, str], float],
          before: Mapping[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    return {key: after.get(key, 0.0) - before.get(key, 0.0) for key in sorted({*after, *before})}


@dataclass
class CallsRun:
    """One batch of mixed creates under one webhook configuration."""

    round: int
    config: str  # BEFORE or AFTER
    creates: int
    created: int
    gpu_pods: int
    calls: dict[tuple[str, str], float] = field(default_factory=dict)  # (name, type) -> calls in the batch
    failures: dict[str, int] = field(default_factory=dict)

    def per_1000(self, key: tuple[str, str]) -> float:
        return 1000 * self.calls.get(key, 0.0) / self.creates if self.creates else 0.0


@dataclass
class LatencyRun(Latencies):
    """One batch of creates of pods without GPU with the webhook on or off."""

    round: int
    state: str  # ON, DECLARED, OFF or FLOOR
    load: str = CLOSED  # CLOSED or paced(rate)
    latencies_ms: list[float] = field(default_factory=list)
    total: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    apiserver_cpu_s: float = 0.0  # the API server's CPU during the creates (/proc)
    # The API server's time evaluating our webhooks' matchConditions (MATCH_METRIC) and calling them
    # (WEBHOOK_METRIC) during the creates.
    match_seconds: float = 0.0
    call_seconds: float = 0.0
    sandboxed_share: float = 0.0  # of the creates, with a sandboxed runtimeClassName (SANDBOXED_SHARE)

    @property
    def cpu_ms_per_create(self) -> float:
        return 1000 * self.apiserver_cpu_s / len(self.latencies_ms) if self.latencies_ms else 0.0

    @property
    def match_us_per_create(self) -> float:
        return 1e6 * self.match_seconds / len(self.latencies_ms) if self.latencies_ms else 0.0

    @property
    def call_us_per_create(self) -> float:
        return 1e6 * self.call_seconds / len(self.latencies_ms) if self.latencies_ms else 0.0


def sandboxed_at(index: int, share: float = SANDBOXED_SHARE) -> str:
    """The RuntimeClass of non-GPU create number `index` ("": none): `share` of them evenly spread, the
    sandboxes taking turns."""
    if int((index + 1) * share) == int(index * share):
        return ""
    names = sorted(SANDBOXES)
    return names[int(index * share) % len(names)]


def latency_ratios(runs: Sequence[LatencyRun], state: str = ON, load: str = CLOSED, against: str = OFF
                   ) -> list[float]:
    """avg(state) / avg(against) of each round that measured both under `load`."""
    runs = [r for r in runs if r.load == load]
    base = {r.round: r.avg_ms for r in runs if r.state == against}
    return [r.avg_ms / base[r.round] for r in sorted(runs, key=lambda r: r.round)
            if r.state == state and base.get(r.round)]


def judged_against(runs: Sequence[LatencyRun], load: str = CLOSED) -> str:
    """What `on` is judged against: the matchConditions floor where it was measured (the least any
    matchConditions cost the API server), else no webhook at all."""
    return FLOOR if any(r.state == FLOOR and r.load == load for r in runs) else OFF


def loads_of(runs: Sequence[LatencyRun]) -> list[str]:
    """The loads measured, CLOSED first, in the order met."""
    return sorted(dict.fromkeys(r.load for r in runs), key=lambda load: load != CLOSED)


def latency_verdict(runs: Sequence[LatencyRun], load: str = CLOSED, state: str = ON) -> tuple[bool, str]:
    ratios = latency_ratios(runs, state, load, judged_against(runs, load))
    runs = [r for r in runs if r.load == load]
    if not ratios:
        return False, "no round measured both"
    failed = sum(r.total - len(r.latencies_ms) for r in runs)
    median = statistics.median(ratios)
    why = []
    if median > LATENCY_RATIO:
        why.append(f"median {median:.2f}x > {LATENCY_RATIO:.2f}x")
    if failed:
        why.append(f"{failed} creates failed")
    return not why, "; ".join(why)


def sandboxed_text(latency: Sequence[LatencyRun]) -> str:
    share = max((r.sandboxed_share for r in latency), default=0.0)
    if not share:
        return "the two-container pod of the section above"
    names = " and ".join(f"`{name}` (handler {handler})" for name, handler in sorted(SANDBOXES.items()))
    return (f"the two-container pod of the section above, {share:.0%} of them with a sandboxed `runtimeClassName` "
            f"({names} in turn, evenly spread), which the chart's matchConditions send to the webhook"
            + (" unless `webhook.policy.nonGpuRuntimeClassNames` names them (`declared`)"
               if any(r.state == DECLARED for r in latency) else "")
            + ", the rest without one, which they do not")


def _med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def render(calls: Sequence[CallsRun], latency: Sequence[LatencyRun], *, stamp: str, command: str,
           conditions: Mapping[str, int], concurrency: int, notes: Sequence[str] = ()) -> str:
    """`conditions`: webhook name -> how many matchConditions the chart renders for it."""
    rounds = max([r.round for r in calls] + [r.round for r in latency], default=0)
    creates = calls[0].creates if calls else 0
    gpu = calls[0].gpu_pods if calls else 0
    rendered = ", ".join(f"{name}: {n}" for name, n in sorted(conditions.items())) or "none"
    out = [BEGIN, "## Webhook calls per 1,000 pod creates, and pods without GPU", "",
           *([stamp, ""] if stamp else []),
           f"Generated by `{command}` (bench/apiserver_load.py, second part): the `make e2e` control plane "
           f"(kube-apiserver v1.36) with the chart installed with default values, as in the section above, the "
           f"webhook configurations pointed at `gpu-stack-webhook serve` on loopback (2 workers x 4 threads) "
           f"with the release's policy. {rounds} round(s), the order of the configurations reversed every other round; "
           f"{concurrency} creates in flight. Calls are the API server's own counter `{CALL_METRIC}` (its "
           "/metrics), summed over code and operation by webhook name and type, read before and after each "
           "batch (the pods of the namespace are deleted and the control plane settles before each).", "",
           f"Calls per 1,000 creates: {creates:,} pods per batch, {gpu} of them ({gpu / max(1, creates):.0%}) "
           "asking for a GPU, the rest without (the two-container pod of the section above, with and without "
           f"`nvidia.com/gpu`). `{BEFORE}`: the chart's rendered Mutating/ValidatingWebhookConfigurations with "
           f"every `matchConditions` removed; `{AFTER}`: as `helm install` created them. matchConditions "
           f"the chart renders, per webhook: {rendered}.", "",
           "| configuration | webhook | type | calls per 1,000 creates (per round) | median | creates failed |",
           "| --- | --- | --- | --- | ---: | ---: |"]
    keys = sorted({key for r in calls for key in r.calls})
    for config in (BEFORE, AFTER):
        runs = sorted((r for r in calls if r.config == config), key=lambda r: r.round)
        for key in keys:
            values = [r.per_1000(key) for r in runs]
            failed = sum(r.creates - r.created for r in runs)
            out.append(f"| {config} | {key[0]} | {key[1]} | {', '.join(f'{v:.0f}' for v in values)} | "
                       f"{_med(values):.0f} | {failed} |")
    floor = any(r.state == FLOOR for r in latency)
    judged = [ON, *([DECLARED] if any(r.state == DECLARED for r in latency) else [])]
    states = [OFF, *judged, *([FLOOR] if floor else [])]
    short = {OFF: "off", ON: "on", DECLARED: "declared", FLOOR: "floor"}
    loads = loads_of(latency)
    ratios = [(s, OFF) for s in states[1:]] + ([(s, FLOOR) for s in judged] if floor else [])
    out += ["", f"Create latency of pods without GPU ({ON} vs {OFF}: both configurations deleted, so the API "
            "server calls nothing"
            + (f"; {DECLARED}: as on, with `webhook.policy.nonGpuRuntimeClassNames` naming the sandboxes below "
               "in the chart's matchConditions" if len(judged) > 1 else "")
            + (f"; {FLOOR}: the configurations present, every webhook's matchConditions "
               "the constant `false`, so the API server calls nothing but pays what "
               "evaluating any matchConditions costs" if floor else "")
            + f"), pods without GPU: {sandboxed_text(latency)}. Loads: `{CLOSED}`, the {concurrency} clients of "
            "the section above, each "
            "sending its next create when the last is answered (the API server flat out: latency follows its "
            "CPU per create)"
            + "".join(f"; `{load}`, creates sent at that rate whatever the answers (Poisson arrivals, the same "
                      "for every state; latency counted from when a create was due)" for load in loads[1:])
            + f". matchConditions µs per create: the API server's own time evaluating both webhooks' "
            f"matchConditions (`{MATCH_METRIC}`, its sum, read before and after each batch), which counts turning "
            "the object and the request into CEL values: the floor's figure is what any matchConditions cost, on "
            "minus floor what the chart's expressions add. Webhook calls µs per create: its time calling them "
            f"(`{WEBHOOK_METRIC}`), for the sandboxed pods the conditions send. Both are elapsed times, so "
            "under the closed loop they also hold waits for a CPU:", "",
            "| round | load | " + " | ".join(f"{short[s]}: avg / p50 / p99 ms" for s in states)
            + "".join(f" | {short[a]} / {short[b]} (avg)" for a, b in ratios)
            + " | API server CPU ms per create, " + " / ".join(short[s] for s in states)
            + " | matchConditions µs per create, " + " / ".join(short[s] for s in states[1:])
            + " | webhook calls µs per create, " + " / ".join(short[s] for s in judged) + " | creates failed |",
            "| ---: | --- | " + "--- | " * len(states) + "---: | " * len(ratios) + "---: | ---: | ---: | ---: |"]
    for i in range(1, rounds + 1):
        for load in loads:
            by = {r.state: r for r in latency if r.round == i and r.load == load}
            if any(s not in by for s in states):
                continue
            cells = [f"{by[s].avg_ms:.1f} / {by[s].percentile_ms(50):.1f} / {by[s].percentile_ms(99):.1f}"
                     for s in states]
            shares = [f"{by[a].avg_ms / by[b].avg_ms if by[b].avg_ms else 0.0:.2f}" for a, b in ratios]
            failed = sum(r.total - len(r.latencies_ms) for r in by.values())
            cpu = " / ".join(f"{by[s].cpu_ms_per_create:.2f}" for s in states)
            match = " / ".join(f"{by[s].match_us_per_create:.0f}" for s in states[1:])
            called = " / ".join(f"{by[s].call_us_per_create:.0f}" for s in judged)
            out.append(f"| {i} | {load} | {' | '.join(cells)} | {' | '.join(shares)} | {cpu} | {match} | "
                       f"{called} | {failed} |")
    out.append("")
    for load in loads:
        against = judged_against(latency, load)
        for state in judged:
            met, why = latency_verdict(latency, load, state)
            declared = state == DECLARED
            line = (f"Target, {load}{', sandboxes declared' if declared else ''}: non-GPU creates with the webhook "
                    f"on{' and the sandboxes declared' if declared else ''} within {LATENCY_RATIO - 1:.0%} "
                    f"of {'the matchConditions floor' if against == FLOOR else 'off'} (median over the rounds of "
                    f"avg({short[state]}) / avg({short[against]}): "
                    f"{_med(latency_ratios(latency, state, load, against)):.2f}x): "
                    f"**{'met' if met else 'not met'}**" + (f" ({why})." if why else "."))
            if floor and not declared:
                line += (f" Against no webhook at all: on {_med(latency_ratios(latency, ON, load)):.2f}x, the floor "
                         f"{_med(latency_ratios(latency, FLOOR, load)):.2f}x (medians): what any matchConditions "
                         "cost the API server on this machine.")
            out += [line, ""]
    out.pop()
    if notes:
        out += ["", *(f"* {n}" for n in notes)]
    out += [END]
    return "\n".join(out) + "\n"


def conditions_of(configurations: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Webhook name -> number of matchConditions, over Mutating/ValidatingWebhookConfiguration objects."""
    return {hook["name"]: len(hook.get("matchConditions") or []) for obj in configurations
            for hook in obj.get("webhooks", [])}


def without_conditions(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch that removes every webhook's matchConditions from a configuration object."""
    return [{"op": "remove", "path": f"/webhooks/{i}/matchConditions"}
            for i, hook in enumerate(obj.get("webhooks", [])) if "matchConditions" in hook]


def floor_conditions(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch that gives every webhook of a configuration object the one matchCondition `false`."""
    return [{"op": "add", "path": f"/webhooks/{i}/matchConditions",
             "value": [{"name": "bench-floor", "expression": "false"}]}
            for i, _ in enumerate(obj.get("webhooks", []))]


def with_conditions(obj: Mapping[str, Any], rendered: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch that gives every webhook of `obj` the matchConditions of the same webhook in
    `rendered` (the object as the chart made it), and removes those the chart did not render."""
    wanted = {hook["name"]: hook.get("matchConditions") for hook in rendered.get("webhooks", [])}
    patch: list[dict[str, Any]] = []
    for i, hook in enumerate(obj.get("webhooks", [])):
        conditions = wanted.get(hook["name"])
        if conditions:
            patch.append({"op": "add", "path": f"/webhooks/{i}/matchConditions", "value": conditions})
        elif "matchConditions" in hook:
            patch.append({"op": "remove", "path": f"/webhooks/{i}/matchConditions"})
    return patch
