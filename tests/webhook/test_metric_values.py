"""Buffered multiprocess metric values (server/metric_values.py), in the mode `serve` runs in: increments
stay in memory until a flush (every second, before /metrics renders, at worker exit), and a forked worker
counts into its own file without the master's pending amounts."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from gpu_stack_webhook.admission.decide import Decision, Endpoint
from gpu_stack_webhook.admission.pipeline import Reply, answer
from gpu_stack_webhook.policy.config import parse_config
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.server import gunicorn_conf, metric_values
from gpu_stack_webhook.server.metrics import Metrics
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from .podlib import container, make_pod, review

REVIEWS = ("gpu_stack_admission_reviews_total", {"endpoint": "validate", "decision": "denied", "kind": "Pod"})
DURATIONS = ("gpu_stack_admission_duration_seconds_count", {"endpoint": "validate"})
FINDINGS = ("gpu_stack_rule_findings_total", {"endpoint": "validate", "rule": "GPU003", "severity": "deny"})


@pytest.fixture
def metrics_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """The directory `serve` prepares (buffered multiprocess values from now on), removed afterwards."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(gunicorn_conf.tempfile, "tempdir", None)
    path = gunicorn_conf.prepare_metrics_dir()
    try:
        yield path
    finally:
        gunicorn_conf.remove_metrics_dir()


@pytest.fixture(scope="module")
def denied() -> Reply:
    """A /validate reply denying a privileged GPU pod (GPU003), as the review routes record it."""
    body = json.dumps(review(make_pod([container("cuda", gpu=1, privileged=True)]))).encode()
    reply = answer(Endpoint.VALIDATE, body, Policy(parse_config({})))
    assert reply.outcome == "denied" and reply.decision is not None
    assert dict(reply.decision.severities()) == {"GPU003": "deny"}
    return reply


def counts(families: Iterable[Metric]) -> tuple[float, ...]:
    """(denied Pod reviews, their durations, their GPU003 findings) on /validate."""
    samples = [s for family in families for s in family.samples]
    return tuple(
        sum(s.value for s in samples if s.name == name and s.labels == labels)
        for name, labels in (REVIEWS, DURATIONS, FINDINGS)
    )


def in_dir(path: str) -> Iterable[Metric]:
    """What a fresh collector (any worker's /metrics) reads from the directory."""
    return MultiProcessCollector(None, path=path).collect()


def in_files_of(path: str, pid: int) -> Iterable[Metric]:
    """What one process wrote to its own files."""
    return MultiProcessCollector.merge([f"{path}/counter_{pid}.db", f"{path}/histogram_{pid}.db"])


def rendered(metrics: Metrics) -> Iterable[Metric]:
    return text_string_to_metric_families(metrics.render().decode())


def test_render_shows_every_review_recorded_in_this_process(metrics_dir: str, denied: Reply) -> None:
    metrics = Metrics(metrics_dir)
    for _ in range(250):
        metrics.record(Endpoint.VALIDATE, denied, 0.0007)
    assert counts(rendered(metrics)) == (250, 250, 250)
    # the increments are in the file now, for the other workers' scrapes
    assert counts(in_dir(metrics_dir)) == (250, 250, 250)


def test_the_process_registry_sees_pending_increments(metrics_dir: str, denied: Reply) -> None:
    # get() is the file's value plus what is pending: the process's own view is always exact
    metrics = Metrics(metrics_dir)
    for _ in range(7):
        metrics.record(Endpoint.VALIDATE, denied, 0.0007)
    assert counts(metrics.registry.collect()) == (7, 7, 7)


def test_the_background_flusher_writes_the_files_without_a_scrape(metrics_dir: str, denied: Reply) -> None:
    metrics = Metrics(metrics_dir)
    for _ in range(40):
        metrics.record(Endpoint.VALIDATE, denied, 0.0007)
    deadline = time.monotonic() + 30  # the flusher runs every FLUSH_INTERVAL_SECONDS; a loaded machine is slow
    while (seen := counts(in_dir(metrics_dir))) != (40, 40, 40) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert seen == (40, 40, 40)


def test_a_reset_is_not_overtaken_by_older_increments(metrics_dir: str) -> None:
    counter = Counter("resettable", "A counter reset while increments are pending.", registry=CollectorRegistry())
    counter.inc(5)
    counter.reset()  # prometheus_client: value.set(0)
    counter.inc(2)
    metric_values.flush_all()
    assert sum(s.value for f in in_dir(metrics_dir) for s in f.samples if s.name == "resettable_total") == 2


def test_a_forked_worker_counts_into_its_own_file_and_not_the_masters_pending(
    metrics_dir: str, denied: Reply
) -> None:
    # As under gunicorn: the app (and its metrics) exists before the fork; here the parent has also
    # recorded reviews that may still be pending when the child starts.
    metrics = Metrics(metrics_dir)
    for _ in range(5):
        metrics.record(Endpoint.VALIDATE, denied, 0.0007)
    child = os.fork()
    if child == 0:  # the worker: record, leave through gunicorn's worker_exit hook, never return to pytest
        status = 1
        try:
            for _ in range(3):
                metrics.record(Endpoint.VALIDATE, denied, 0.0007)
            hook = gunicorn_conf.settings(gunicorn_conf.ServeOptions(bind="b", certfile="c", keyfile="k"))
            hook["worker_exit"](None, None)
            status = 0
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(status)
    _, wait_status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0
    assert counts(in_files_of(metrics_dir, child)) == (3, 3, 3)
    assert counts(rendered(metrics)) == (8, 8, 8)  # the parent's 5 once, the child's 3
    assert counts(in_files_of(metrics_dir, os.getpid())) == (5, 5, 5)


def test_a_recorded_review_is_what_inc_and_observe_would_have_counted() -> None:
    """Metrics.record updates the label children's values directly (metrics.ReviewRecorder): the same
    samples as prometheus_client's own Counter.inc() and Histogram.observe(), on a bound and beyond the last.
    (In-memory values: in multiprocess mode both registries would share one file's entries.)"""
    seconds = [0.0, 0.0004, 0.0005, 0.0051, 1.0, 2.5, 9.0]
    denied = Decision(False, code=403, message="m", denied_by=("GPU002",), warned=("GPU003",))
    ours = Metrics()
    theirs = Metrics()
    for s in seconds:
        ours.record(Endpoint.VALIDATE, Reply(200, b"", None, None), s)
        theirs.reviews.labels("validate", "error", "unknown").inc()
        theirs.duration.labels("validate").observe(s)
    ours.record(Endpoint.VALIDATE, Reply(200, b"", None, denied), 0.002)
    theirs.reviews.labels("validate", "denied", "unknown").inc()
    theirs.duration.labels("validate").observe(0.002)
    theirs.findings.labels("validate", "GPU002", "deny").inc()
    theirs.findings.labels("validate", "GPU003", "warn").inc()

    def samples(m: Metrics) -> list[tuple[str, dict[str, str], float]]:
        return sorted(((s.name, s.labels, s.value) for family in m.registry.collect() for s in family.samples
                       if not s.name.endswith("_created")), key=repr)

    assert samples(ours) == samples(theirs)
    bucket = ("gpu_stack_admission_duration_seconds_bucket", {"endpoint": "validate", "le": "0.0005"}, 3.0)
    assert bucket in samples(ours)
