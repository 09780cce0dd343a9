"""`inspect --usage` / `--idle`: which Prometheus to ask, with what thresholds, and the asking itself: the
instant query time() (Prometheus's clock, for the window and the skew) and one range query per metric of
usage.METRICS over every series (all holders in one query, never one per pod or node); usage.join does the
rest."""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_stack_webhook.gpuinspect import usage as gpu_usage
from gpu_stack_webhook.gpuinspect.prometheus import (
    DEFAULT_TIMEOUT,
    Client,
    PrometheusError,
    ProxyTransport,
    Transport,
    UrlTransport,
)
from gpu_stack_webhook.gpuinspect.records import Report

# The Service prometheus-operator puts in front of every Prometheus it runs (kube-prometheus-stack included).
DEFAULT_SERVICE = "monitoring/prometheus-operated:9090"
# The chart's idle thresholds, when its device plugin ConfigMap carries them (monitoring.idleGpu values).
IDLE_ANNOTATIONS = ("gpu-stack.io/idle-gpu-utilization-percent-below", "gpu-stack.io/idle-gpu-window")
STEPS = 15  # samples per series over the window (a 30m window: every 2 minutes)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("GPU use (dcgm-exporter's series in Prometheus)")
    group.add_argument("--usage", action="store_true",
                       help="each holder pod's GPU utilisation and framebuffer memory over --since")
    group.add_argument("--idle", action="store_true",
                       help="holder pods under --idle-below %% GPU utilisation for all of --since, "
                            "most GPU-hours first")
    group.add_argument("--since", metavar="DURATION",
                       help="the window, e.g. 30m, 2h (default: the chart's idle window, else 30m)")
    group.add_argument("--idle-below", type=float, metavar="PERCENT",
                       help="idle threshold in percent (default: the chart's, else 5)")
    group.add_argument("--prometheus", metavar="URL", help="ask this Prometheus directly")
    group.add_argument("--prometheus-service", metavar="NAMESPACE/NAME:PORT",
                       help="ask the in-cluster Service through the API server's proxy with the kubeconfig's "
                            f"credentials (the default path; default {DEFAULT_SERVICE})")
    group.add_argument("--prometheus-token-file", metavar="FILE", help="bearer token for --prometheus")
    group.add_argument("--prometheus-ca", metavar="FILE", help="CA bundle to verify --prometheus's certificate")
    group.add_argument("--prometheus-timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                       help="per query (default %(default)g)")


@dataclass(frozen=True)
class Settings:
    window: str
    seconds: float
    below: float


def settings(args: argparse.Namespace, annotations: Mapping[str, str]) -> tuple[Settings, list[str]]:
    """Flags win; then the chart's annotations; then 5 % / 30m. A bad flag is a ValueError (exit 2);
    a bad annotation a note, and the default."""
    notes = []
    below_note, window_note = (annotations.get(k) for k in IDLE_ANNOTATIONS)
    window = args.since or window_note or gpu_usage.DEFAULT_WINDOW
    try:
        seconds = gpu_usage.parse_window(window)
    except ValueError as exc:
        if args.since:
            raise
        notes.append(f"{IDLE_ANNOTATIONS[1]}: {exc}; using {gpu_usage.DEFAULT_WINDOW}")
        window, seconds = gpu_usage.DEFAULT_WINDOW, gpu_usage.parse_window(gpu_usage.DEFAULT_WINDOW)
    below = args.idle_below
    if below is None:
        try:
            below = float(below_note) if below_note else gpu_usage.DEFAULT_BELOW
        except ValueError:
            notes.append(f"{IDLE_ANNOTATIONS[0]}: not a number ({below_note!r}); using {gpu_usage.DEFAULT_BELOW:g}")
            below = gpu_usage.DEFAULT_BELOW
    if not 0 < below <= 100:
        raise ValueError(f"--idle-below must be in (0, 100], got {below:g}")
    return Settings(window, seconds, below), notes


def transport(args: argparse.Namespace, api: Any) -> Transport:
    """ValueError for a malformed --prometheus-service."""
    if args.prometheus:
        token = None
        if args.prometheus_token_file:
            with open(args.prometheus_token_file, encoding="utf-8") as handle:
                token = handle.read().strip()
        return UrlTransport(args.prometheus, token, args.prometheus_ca, args.prometheus_timeout)
    spec = args.prometheus_service or DEFAULT_SERVICE
    namespace, _, rest = spec.partition("/")
    name, _, port = rest.partition(":")
    if not (namespace and name and port):
        raise ValueError(f"--prometheus-service must be NAMESPACE/NAME:PORT, got {spec!r}")
    return ProxyTransport(api, namespace, name, port, args.prometheus_timeout)


@dataclass(frozen=True)
class Answers:
    """What Prometheus answered: the window it ends at its clock, and each metric's figures (or the failure)."""
    start: float
    end: float
    step: float
    skew: float
    series: Mapping[str, Any]
    error: PrometheusError | None = None


def collect(client: Client, chosen: Settings, clock: Any = time.time) -> Answers:
    """Prometheus's clock first (the window ends there), then one range query per metric. Needs nothing of the
    cluster's answers, so `Pending` runs it while the cluster is read."""
    start = end = step = skew = 0.0
    try:
        mine = clock()
        end = client.now()
        start, step, skew = end - chosen.seconds, max(chosen.seconds / STEPS, 1.0), end - mine
        # One metric at a time, each reduced to its figures before the next is asked: one answer in memory.
        series = {metric: gpu_usage.summaries(client.range(gpu_usage.range_query(metric), start, end, step))
                  for metric in gpu_usage.METRICS}
    except PrometheusError as exc:
        return Answers(start, end, step, skew, {}, exc)
    return Answers(start, end, step, skew, series)


def usage_of(report: Report, client: Client, chosen: Settings, answers: Answers) -> gpu_usage.Usage:
    if answers.error is not None:
        return gpu_usage.failed(client.where, chosen.window, chosen.below, str(answers.error),
                                status=answers.error.kind, queries=client.queries)
    return gpu_usage.join(report, answers.series, window=chosen.window, start=answers.start, end=answers.end,
                          step=answers.step, below=chosen.below, where=client.where, skew=answers.skew,
                          queries=client.queries)


def ask(report: Report, client: Client, chosen: Settings, clock: Any = time.time) -> gpu_usage.Usage:
    return usage_of(report, client, chosen, collect(client, chosen, clock))


class Pending:
    """`collect` in a thread of its own, started as soon as the thresholds are known: the cluster is read
    meanwhile, and the two waits (the API server's, Prometheus's evaluation) overlap."""

    def __init__(self, client: Client, chosen: Settings, clock: Any = time.time) -> None:
        self.client, self.chosen = client, chosen
        self._answers: Answers | None = None
        self._failure: BaseException | None = None
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._run, args=(clock,), name="prometheus", daemon=True)
        self._thread.start()

    def _run(self, clock: Any) -> None:
        started = time.perf_counter()
        try:
            self._answers = collect(self.client, self.chosen, clock)
        except BaseException as exc:
            self._failure = exc
        self.seconds = time.perf_counter() - started  # the queries (inspect -v: with the join, below)

    def usage(self, report: Report) -> gpu_usage.Usage:
        self._thread.join()
        if self._failure is not None:
            raise self._failure
        assert self._answers is not None
        started = time.perf_counter()
        usage = usage_of(report, self.client, self.chosen, self._answers)
        self.seconds += time.perf_counter() - started  # and the join
        return usage
