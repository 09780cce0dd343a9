"""Prometheus metrics of the review routes, read from the structured reply (admission/pipeline.py)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import values as prometheus_values
from prometheus_client.multiprocess import MultiProcessCollector

from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.admission.pipeline import Reply
from gpu_stack_webhook.admission.review import AdmissionRequest
from gpu_stack_webhook.policy.engine import JUDGED_KINDS
from gpu_stack_webhook.server import metric_values

# Sub-millisecond policy evaluation up to the apiserver's patience (timeoutSeconds is at most 30 s).
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def multiprocess_dir(path: str | None) -> str | None:
    """The aggregation directory (WebhookSettings.prometheus_multiproc_dir), only when prometheus_client really
    writes values to files (it picks its value class when first imported, or when
    gunicorn_conf.prepare_metrics_dir switches it)."""
    return path if path and prometheus_values.ValueClass is not prometheus_values.MutexValue else None


def kind_label(request: AdmissionRequest | None) -> str:
    """Bounded label values: the kinds we judge, everything else is `other`; `unknown` before parsing."""
    if request is None:
        return "unknown"
    return request.kind if (request.group, request.kind) in JUDGED_KINDS else "other"


Increment = Callable[[float], None]


def _counter_increment(child: Counter) -> Increment:
    """`inc(amount)` of a label child: its value's own (see ReviewRecorder), else the public `Counter.inc`."""
    value = getattr(child, "_value", None)
    return value.inc if value is not None else child.inc  # type: ignore[no-any-return,unused-ignore]


class ReviewRecorder:
    """Counts one review and observes its duration, given the two label children of its label set.

    Straight on the children's values (prometheus_client's `_value`, `_sum`, `_upper_bounds` and
    `_buckets`, what `Counter.inc(1)` and `Histogram.observe(s)` update after checks that cannot fail
    here: a label child, a positive count): three increments instead of nine calls per review. Where the
    pinned prometheus_client does not have them, the public calls."""

    __slots__ = ("bounds", "buckets", "count", "duration", "total")

    def __init__(self, count: Counter, duration: Histogram) -> None:
        self.count = _counter_increment(count)
        self.duration = duration
        try:
            self.total: Increment | None = duration._sum.inc
            self.bounds: list[float] = list(duration._upper_bounds)
            self.buckets: list[Increment] = [bucket.inc for bucket in duration._buckets]
        except AttributeError:
            self.total, self.bounds, self.buckets = None, [], []
            return
        if len(self.bounds) != len(self.buckets) or self.bounds[-1] != float("inf"):
            raise RuntimeError("prometheus_client histogram buckets are not what ReviewRecorder expects")

    def observe(self, seconds: float) -> None:
        self.count(1)
        if self.total is None:
            self.duration.observe(seconds)
            return
        self.total(seconds)
        self.buckets[bisect_left(self.bounds, seconds)](1)  # the first bucket whose bound is >= seconds, as observe()


class Metrics:
    """The app's metrics on a private registry (so several apps can live in one test process).
    With PROMETHEUS_MULTIPROC_DIR set (gunicorn) the values live in files and /metrics aggregates them.
    Compiled (webhook/setup.py) with server/metric_values.py: `record` runs on every review."""

    __slots__ = ("_findings", "_reviews", "duration", "findings", "multiprocess_dir", "registry", "reviews",
                 "source_read")

    def __init__(self, multiprocess_dir: str | None = None, registry: CollectorRegistry | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir
        self.registry = CollectorRegistry(auto_describe=True) if registry is None else registry
        # Looked up once per label set (label values are bounded), one table per endpoint: (outcome, kind) ->
        # the recorder of a review and its duration; (crashed, denied_by, warned, mutated) -> the findings
        # counters' increments (a handful of rule combinations occur). The endpoint picks its table by
        # identity: an Enum member's hash is a Python-level call (Enum.__hash__), and hashing it in every
        # key was most of `record` (py-spy, BENCHMARKS.md's layer table).
        self._reviews: tuple[dict[tuple[str, str], ReviewRecorder], dict[tuple[str, str], ReviewRecorder]] = ({}, {})
        self._findings: tuple[dict[tuple[object, ...], tuple[Increment, ...]],
                              dict[tuple[object, ...], tuple[Increment, ...]]] = ({}, {})
        self.reviews = Counter(
            "gpu_stack_admission_reviews",
            "Admission requests answered, by endpoint, outcome and object kind.",
            ["endpoint", "decision", "kind"],
            registry=self.registry,
        )
        self.findings = Counter(
            "gpu_stack_rule_findings",
            "Decisions in which a rule reported, by endpoint, rule and severity (deny, warn, error).",
            ["endpoint", "rule", "severity"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "gpu_stack_admission_duration_seconds",
            "Time to answer an admission request, from routing to the serialised response.",
            ["endpoint"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )

        # Set only by the worker's policy-source thread (server/live_policy.py), never in gunicorn's master: the
        # stalest live worker is what a scrape reports.
        self.source_read = Gauge(
            "gpu_stack_policy_source_last_read_timestamp_seconds",
            "Unix time at which the API server last answered every read of a policy source (gpu-operator, "
            "device-plugin, runtime-classes); 0: never. Past webhook.policySource.keepLastGoodRead the webhook "
            "denies GPU pods (GPU010).",
            ["source"],
            registry=self.registry,
            multiprocess_mode="livemin",
        )

    def publish_source_reads(self, reads: dict[str, float]) -> None:
        """Each policy source's last full read (kube/live.py LastGood.last_read)."""
        for source, when in reads.items():
            self.source_read.labels(source).set(when)

    def record(self, endpoint: Endpoint, reply: Reply, seconds: float) -> None:
        """Count one answered review: a dict lookup per label set, then increments that stay in memory
        until the next flush in multiprocess mode (metric_values.py)."""
        table = 1 if endpoint is Endpoint.MUTATE else 0
        key = (reply.outcome, kind_label(reply.request))
        reviews = self._reviews[table]
        review = reviews.get(key)
        if review is None:
            review = reviews[key] = ReviewRecorder(
                self.reviews.labels(endpoint.value, key[0], key[1]), self.duration.labels(endpoint.value)
            )
        review.observe(seconds)
        decision = reply.decision
        if decision is not None and (decision.denied_by or decision.warned or decision.mutated or decision.crashed):
            # Decision.severities() is a function of the rule roles: count them once per combination.
            roles = (decision.crashed, decision.denied_by, decision.warned, decision.mutated)
            by_roles = self._findings[table]
            findings = by_roles.get(roles)
            if findings is None:
                findings = by_roles[roles] = tuple(
                    _counter_increment(self.findings.labels(endpoint.value, rule, severity))
                    for rule, severity in decision.severities()
                )
            for count_finding in findings:
                count_finding(1)

    def render(self) -> bytes:
        if self.multiprocess_dir:
            metric_values.flush_all()  # this process exactly; the other workers as of their last flush
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=self.multiprocess_dir)  # type: ignore[no-untyped-call,unused-ignore]
            return generate_latest(registry)
        return generate_latest(self.registry)
