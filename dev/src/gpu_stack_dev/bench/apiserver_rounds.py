"""The bookkeeping of bench/apiserver_load.py, kept free of clusters and clocks so tests can check it:
which target runs when (rotation), what one run recorded, the per-round ratios, their median and
worst, and the Markdown section written into BENCHMARKS.md."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BEGIN = "<!-- apiserver-load:begin (bench/apiserver_load.py) -->"
END = "<!-- apiserver-load:end -->"
TARGET_RATIO = 1.25
TARGET_P99_MS = 1000.0

NONE = "no webhook"
BARE = "bare allow-all"
BARE_ANSWERS = "bare, our answers"
OURS = "gpu-stack webhook"
TARGETS = (NONE, BARE, BARE_ANSWERS, OURS)
# (numerator, denominator, what the ratio says); the first is the bar.
COMPARISONS = (
    (OURS, BARE, "the issue's bar: our webhooks vs the same configurations on a bare allow-all"),
    (OURS, BARE_ANSWERS, "our server's own cost: both send the same answers (patch, warning, audit annotation)"),
    (BARE_ANSWERS, BARE, "the API server applying our mutation (JSONPatch, in-tree plugins re-run, warning)"),
    (NONE, BARE, "reference: the API server calling no webhook at all vs the bare allow-all"),
)


def rotation(targets: Sequence[str], round_index: int) -> list[str]:
    """The order of the targets in round `round_index` (0-based): rotated by one each round, so over
    len(targets) rounds every target runs once in every position (first after the settle, last...)."""
    if not targets:
        return []
    shift = round_index % len(targets)
    return [*targets[shift:], *targets[:shift]]


class Latencies:
    """Average and percentiles of `latencies_ms` (milliseconds per create), for the batches that hold it."""

    latencies_ms: list[float]

    @property
    def avg_ms(self) -> float:
        return statistics.fmean(self.latencies_ms) if self.latencies_ms else 0.0

    def percentile_ms(self, p: float) -> float:
        if not self.latencies_ms:
            return 0.0
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@dataclass
class Run(Latencies):
    """One measured batch of creates: one target, one concurrency, one round."""

    round: int  # 1-based
    position: int  # 1-based place of the target in its round
    target: str
    concurrency: int
    total: int
    latencies_ms: list[float] = field(default_factory=list)  # created pods only
    failures: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    load1: float = 0.0  # 1-minute load average of the machine when the batch started
    settle_s: float = 0.0  # how long the control plane took to go quiet before the batch
    apiserver_cpu_ms: float = 0.0  # kube-apiserver CPU per created pod during the batch
    etcd_cpu_ms: float = 0.0
    webhook_cpu_ms: float = 0.0  # the webhook server's CPU (master + workers) per created pod
    calls: dict[str, float] = field(default_factory=dict)  # webhook calls per created pod, by webhook
    call_ms: dict[str, float] = field(default_factory=dict)  # average webhook call as the API server timed it
    closed_per_100: float = 0.0  # webhook connections closed (TIME-WAIT) per 100 created pods
    gc_cycles: int = 0  # Go GC cycles of the API server during the batch
    compactions: int = 0  # etcd compactions during the batch

    @property
    def created(self) -> int:
        return len(self.latencies_ms)

    @property
    def rate(self) -> float:
        return self.created / self.seconds if self.seconds else 0.0

    @property
    def max_ms(self) -> float:
        return max(self.latencies_ms, default=0.0)


def save(runs: Sequence[Run], path: Path, meta: Mapping[str, Any]) -> None:
    """The raw figures of every run and how they were made (`meta`: command, creates, ...), as JSON."""
    # Not dataclasses.asdict: it rebuilds a Counter from (key, count) pairs, counting the pairs.
    raws = [{**vars(r), "failures": dict(r.failures)} for r in runs]
    path.write_text(json.dumps({**meta, "runs": raws}, indent=1) + "\n", encoding="utf-8")


def load(path: Path) -> tuple[list[Run], dict[str, Any]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    raws = data.pop("runs")
    return [Run(**{**raw, "failures": Counter(raw["failures"])}) for raw in raws], data


def find(runs: Sequence[Run], target: str, concurrency: int) -> list[Run]:
    return sorted((r for r in runs if r.target == target and r.concurrency == concurrency), key=lambda r: r.round)


def average_latency(run: Run) -> float:
    return run.avg_ms


def cpu_per_pod(run: Run) -> float:
    """CPU of the API server, etcd and the webhook server per created pod: less sensitive than latency
    to what else runs on the machine."""
    return run.apiserver_cpu_ms + run.etcd_cpu_ms + run.webhook_cpu_ms


def round_ratios(runs: Sequence[Run], numerator: str, denominator: str, concurrency: int,
                 metric: Callable[[Run], float] = average_latency) -> list[float]:
    """metric(numerator) / metric(denominator) in each round that measured both (default: average latency)."""
    below = {r.round: metric(r) for r in find(runs, denominator, concurrency)}
    return [metric(r) / below[r.round] for r in find(runs, numerator, concurrency) if below.get(r.round)]


@dataclass(frozen=True)
class RatioSummary:
    ratios: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.ratios) if self.ratios else 0.0

    @property
    def worst(self) -> float:
        return max(self.ratios, default=0.0)

    @property
    def best(self) -> float:
        return min(self.ratios, default=0.0)


def summarize(runs: Sequence[Run], numerator: str, denominator: str, concurrency: int,
              metric: Callable[[Run], float] = average_latency) -> RatioSummary:
    return RatioSummary(tuple(round_ratios(runs, numerator, denominator, concurrency, metric)))


def verdict(runs: Sequence[Run], concurrencies: Sequence[int]) -> tuple[bool, list[str]]:
    """The issue's target for our webhooks: every create succeeds, p99 < 1 s in every run, and the median
    over the rounds of avg(ours) / avg(bare allow-all) <= 1.25. (met, reasons it is not)."""
    why = []
    for c in concurrencies:
        ours = find(runs, OURS, c)
        if not ours:
            why.append(f"{c} in flight: no run of {OURS}")
            continue
        failed = sum(r.total - r.created for r in ours)
        if failed:
            why.append(f"{c} in flight: {failed} creates failed")
        slow = [r for r in ours if r.percentile_ms(99) >= TARGET_P99_MS]
        if slow:
            none = find(runs, NONE, c)
            also = sum(1 for r in none if r.percentile_ms(99) >= TARGET_P99_MS)
            why.append(f"{c} in flight: p99 >= {TARGET_P99_MS:.0f} ms in {len(slow)} of {len(ours)} runs"
                       + (f" (with no webhook at all: {also} of {len(none)})" if none else ""))
        ratio = summarize(runs, OURS, BARE, c)
        if not ratio.ratios:
            why.append(f"{c} in flight: no round with both {OURS} and {BARE}")
        elif ratio.median > TARGET_RATIO:
            why.append(f"{c} in flight: median ratio {ratio.median:.2f}x > {TARGET_RATIO}x")
    return not why, why


def _med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def _ms(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def render(runs: Sequence[Run], *, command: str, creates: int, rounds: int, concurrencies: Sequence[int],
           targets: Sequence[str], notes: Sequence[str] = (), stamp: str = "") -> str:
    loads = [r.load1 for r in runs]
    out = [BEGIN, "## Pod creation through the API server", "",
           *([stamp, ""] if stamp else []),
           f"Generated by `{command}` (bench/apiserver_load.py): one kube-apiserver v1.36 from the `make e2e` "
           f"control plane, the chart installed with default values; per run {creates} two-container GPU pods "
           f"POSTed with `generateName` after a warm-up batch (one per client, not counted); {rounds} rounds, "
           "every target in every round, the order rotated by one each round. Before every batch the "
           "namespace's pods are deleted and the bench waits until etcd, the API server and the controller "
           "manager are quiet, so every batch starts from the same state. The webhook servers run for the "
           "whole bench (2 workers x 4 threads, TLS 1.3, HTTP/1.1: neither offers h2). "
           f"Load average of the machine at the start of the runs: {min(loads, default=0):.1f}-"
           f"{max(loads, default=0):.1f}.", ""]
    out += ["Targets: `no webhook` = a namespace opted out by label (the API server calls nothing); "
            "`bare allow-all` = the release's two webhook configurations pointed at bench/baseline_app.py "
            "(answers `allowed: true`); `bare, our answers` = the same app answering /mutate exactly as our "
            "webhook does for this pod (GPU008's JSONPatch adding `runtimeClassName: nvidia`, its warning, "
            "the `mutations` audit annotation); `gpu-stack webhook` = `gpu-stack-webhook serve` with the "
            "release's policy.", ""]
    out += ["| in flight | target | created | pods/s | p50 ms | avg ms | p99 ms (worst) | max ms | "
            "API server CPU ms/pod | webhook CPU ms/pod | webhook calls/pod x avg call (API server's timing) |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for c in concurrencies:
        for t in targets:
            rs = find(runs, t, c)
            if not rs:
                continue
            names = sorted({name for r in rs for name in r.calls})
            call_text = ", ".join(
                f"{name.split('.')[0]} {_med([r.calls.get(name, 0.0) for r in rs]):.2f}"
                f" x {_ms(_med([r.call_ms.get(name, 0.0) for r in rs]))} ms" for name in names) or "-"
            created = f"{sum(r.created for r in rs)}/{sum(r.total for r in rs)}"
            out.append(
                f"| {c} | {t} | {created} | {_med([r.rate for r in rs]):.0f} | "
                f"{_ms(_med([r.percentile_ms(50) for r in rs]))} | {_ms(_med([r.avg_ms for r in rs]))} | "
                f"{_ms(_med([r.percentile_ms(99) for r in rs]))} ({_ms(max(r.percentile_ms(99) for r in rs))}) | "
                f"{_ms(max(r.max_ms for r in rs))} | {_med([r.apiserver_cpu_ms for r in rs]):.2f} | "
                f"{_med([r.webhook_cpu_ms for r in rs]):.2f} | {call_text} |")
    out += ["", "Medians over the rounds (p99: median, worst in brackets; max: worst). CPU from /proc during the "
            "measured batch only, per created pod. Ratios pair the two runs of the same round; `CPU per pod` is "
            "API server + etcd + webhook server, less sensitive than latency to other work on the machine.", "",
            "| in flight | ratio | of | per round | median | worst |",
            "| ---: | --- | --- | --- | ---: | ---: |"]
    for c in concurrencies:
        for num, den, what in COMPARISONS:
            if num not in targets or den not in targets:
                continue
            for label, metric in (("average latency", average_latency), ("CPU per pod", cpu_per_pod)):
                s = summarize(runs, num, den, c, metric)
                if s.ratios and (metric is average_latency or NONE not in (num, den)):
                    per_round = ", ".join(f"{x:.2f}" for x in s.ratios)
                    out.append(f"| {c} | {num} / {den} ({what}) | {label} | {per_round} | {s.median:.2f}x | "
                               f"{s.worst:.2f}x |")
    met, why = verdict(runs, concurrencies)
    out += ["", f"Target: every create succeeds at {' and '.join(map(str, concurrencies))} in flight, "
            f"p99 < {TARGET_P99_MS:.0f} ms in every run, and the median over the rounds of avg(ours) / "
            f"avg(bare allow-all) <= {TARGET_RATIO}x: **{'met' if met else 'not met'}**"
            + (f" ({'; '.join(why)})." if why else ".")]
    if notes:
        out += ["", *(f"* {n}" for n in notes)]
    out += ["", "<details><summary>Every run</summary>", "",
            "| round | # | in flight | target | load avg | settle s | created | avg ms | p99 ms | API server CPU "
            "ms/pod | etcd CPU ms/pod | webhook conns closed /100 pods | GC cycles | compactions | failures |",
            "| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in sorted(runs, key=lambda r: (r.round, r.position, r.concurrency)):
        fails = "; ".join(f"{n} x {what}" for what, n in r.failures.most_common(2)) or "0"
        out.append(f"| {r.round} | {r.position} | {r.concurrency} | {r.target} | {r.load1:.1f} | {r.settle_s:.1f} | "
                   f"{r.created}/{r.total} | {_ms(r.avg_ms)} | {_ms(r.percentile_ms(99))} | {r.apiserver_cpu_ms:.2f} | "
                   f"{r.etcd_cpu_ms:.2f} | {r.closed_per_100:.1f} | {r.gc_cycles} | {r.compactions} | {fails} |")
    out += ["", "</details>", END]
    return "\n".join(out) + "\n"
