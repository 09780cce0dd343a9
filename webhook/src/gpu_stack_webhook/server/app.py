"""The HTTP layer: a Flask app that parses an AdmissionReview, asks the policy engine, serialises the answer.

Everything about the object is decided in engine.py; this module only turns HTTP into calls and back:

* POST /mutate, POST /validate: JSON only (415), bounded body (413, checked from Content-Length before
  reading and enforced while reading), unreadable review (400). Errors are JSON `{"error": ...}`.
* Fail closed: an unexpected exception once the review is parsed is still answered with HTTP 200 and
  an AdmissionReview: /validate denies (code 500), /mutate allows unchanged with a warning (the
  validating pass then judges the object). Only when the uid is unknown do we answer HTTP 500.
* GET /healthz (alive), /readyz (config loaded and the readiness hook agrees), /metrics (Prometheus;
  aggregated over gunicorn workers when PROMETHEUS_MULTIPROC_DIR is set).
* One JSON log line per decision, never the object itself.
"""

from __future__ import annotations

import io
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from flask import Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import values as prometheus_values
from prometheus_client.multiprocess import MultiProcessCollector
from werkzeug.exceptions import (
    BadRequest,
    HTTPException,
    InternalServerError,
    RequestEntityTooLarge,
    UnsupportedMediaType,
)
from werkzeug.wrappers import Response as BaseResponse

from gpu_stack_webhook.admission.decide import Endpoint, review
from gpu_stack_webhook.admission.review import AdmissionRequest, BadReview, Decision, build_response, parse_review
from gpu_stack_webhook.policy.config import CONFIG_ENV, PolicyConfig, load_config
from gpu_stack_webhook.policy.engine import JUDGED_KINDS, Policy
from gpu_stack_webhook.policy.facts import OFFLINE, ClusterFacts
from gpu_stack_webhook.policy.rules import RULES, Rule
from gpu_stack_webhook.server.gunicorn_conf import MULTIPROC_ENV
from gpu_stack_webhook.server.reloader import PolicySource, serving_policy

DECISION_LOGGER = "gpu_stack_webhook.decisions"
log = logging.getLogger("gpu_stack_webhook.server.app")
decision_log = logging.getLogger(DECISION_LOGGER)

# Sub-millisecond policy evaluation up to the apiserver's patience (timeoutSeconds is at most 30 s).
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
OUTCOMES = ("allowed", "denied", "patched", "skipped", "error")
INTERNAL_ERROR_KEY = "internal-error"
# WSGI environ key under which the fast path hands a body it already read to the Flask path.
BODY_READ_KEY = "gpu_stack.body"


def _always_ready() -> bool:
    return True


@dataclass(frozen=True)
class AppConfig:
    """What the app needs: the loaded policy, where it came from, and a readiness hook."""

    policy: PolicyConfig
    policy_path: str | None = None
    # Called by /readyz; False (or an exception) answers 503. Self-managed TLS plugs its ready-file in here.
    readiness: Callable[[], bool] = _always_ready
    rules: tuple[Rule, ...] = RULES
    # Cluster lookups for the rules (facts.py); offline unless `serve --cluster-lookups`.
    facts: ClusterFacts = OFFLINE

    @property
    def max_request_bytes(self) -> int:
        return self.policy.max_request_bytes

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, **kwargs: Any) -> AppConfig:
        """Read the policy file at `path`, else $GPU_STACK_WEBHOOK_CONFIG, else built-in defaults.
        Raises ConfigError naming the bad key."""
        resolved = str(path) if path else os.environ.get(CONFIG_ENV) or None
        return cls(policy=load_config(resolved), policy_path=resolved, **kwargs)


# --- the review pipeline, shared with `gpu-stack-webhook check` -------------------------------------


@dataclass(frozen=True)
class Answer:
    request: AdmissionRequest
    decision: Decision
    response: dict[str, Any]
    outcome: str  # one of OUTCOMES
    error: str = ""  # the unexpected exception, for the log line only


def internal_error_decision(endpoint: Endpoint) -> Decision:
    """Fail closed on /validate, fail open without changes on /mutate (the validating pass still judges)."""
    audit = {INTERNAL_ERROR_KEY: "webhook"}
    if endpoint is Endpoint.MUTATE:
        return Decision(
            allowed=True, warnings=("gpu-stack: internal error; the object was not mutated",), audit=audit
        )
    return Decision(
        allowed=False, code=500, message="gpu-stack: internal error (denied to fail closed)", audit=audit
    )


def outcome_of(decision: Decision, endpoint: Endpoint) -> str:
    if INTERNAL_ERROR_KEY in decision.audit or decision.code == 500:
        return "error"
    if decision.skipped:
        return "skipped"
    if not decision.allowed:
        return "denied"
    if endpoint is Endpoint.MUTATE and decision.patch:
        return "patched"
    return "allowed"


def answer_review(policy: Policy, endpoint: Endpoint, body: Any) -> Answer:
    """Parse an AdmissionReview (raises BadReview), judge it and build the response. Never raises
    anything else: once the uid is known every failure becomes a fail-closed decision."""
    parsed = parse_review(body)
    allow_patch = endpoint is Endpoint.MUTATE
    try:
        decision = review(policy, parsed, endpoint)
        response = build_response(parsed.uid, decision, allow_patch=allow_patch)
        error = ""
    except Exception as exc:
        log.exception("unexpected error reviewing %s %s", endpoint.value, parsed.uid)
        decision = internal_error_decision(endpoint)
        response = build_response(parsed.uid, decision, allow_patch=allow_patch)
        error = f"{type(exc).__name__}: {exc}"
    return Answer(parsed, decision, response, outcome_of(decision, endpoint), error)


# --- metrics ----------------------------------------------------------------------------------------


def _multiprocess_dir() -> str | None:
    """The aggregation directory, only when prometheus_client really writes values to files (it picks
    its value class when first imported, so the variable must have been set before that)."""
    path = os.environ.get(MULTIPROC_ENV)
    return path if path and prometheus_values.ValueClass is not prometheus_values.MutexValue else None


@dataclass
class Metrics:
    """The app's metrics on a private registry (so several apps can live in one test process).
    With PROMETHEUS_MULTIPROC_DIR set (gunicorn) the values live in files and /metrics aggregates them."""

    multiprocess_dir: str | None = field(default_factory=_multiprocess_dir)
    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))

    def __post_init__(self) -> None:
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

    def record(self, endpoint: Endpoint, outcome: str, kind: str, decision: Decision | None, seconds: float) -> None:
        self.reviews.labels(endpoint.value, outcome, kind).inc()
        self.duration.labels(endpoint.value).observe(seconds)
        if decision is None:
            return
        denied_by = set(decision.audit.get("denied-by", "").split(","))
        crashed = decision.audit.get(INTERNAL_ERROR_KEY, "")
        for rule in decision.rules:
            severity = "error" if rule == crashed else ("deny" if rule in denied_by else "warn")
            self.findings.labels(endpoint.value, rule, severity).inc()

    def render(self) -> bytes:
        if self.multiprocess_dir:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=self.multiprocess_dir)  # type: ignore[no-untyped-call,unused-ignore]
            return generate_latest(registry)
        return generate_latest(self.registry)


def _kind_label(req: AdmissionRequest) -> str:
    """Bounded label values: the kinds we judge, everything else is `other`."""
    return req.kind if (req.group, req.kind) in JUDGED_KINDS else "other"


# --- the Flask app ----------------------------------------------------------------------------------


def _json(payload: Mapping[str, Any], status: int = 200) -> Response:
    return Response(json.dumps(payload, separators=(",", ":")), status=status, mimetype="application/json")


def _error_response(exc: HTTPException) -> BaseResponse:
    """Werkzeug's response for the error (keeps headers such as Allow on 405) with a JSON body."""
    response = exc.get_response()
    response.set_data(json.dumps({"error": exc.description or exc.name}))
    response.mimetype = "application/json"
    return response


def _review(endpoint: Endpoint, policy: PolicySource, metrics: Metrics, limit: int) -> Response:
    """POST /mutate and /validate: parse, judge, serialise; count and log every outcome."""
    started = time.perf_counter()
    try:
        if not request.is_json:
            raise UnsupportedMediaType(f"Content-Type must be application/json, got {request.mimetype or 'none'}")
        if request.content_length is not None and request.content_length > limit:
            raise RequestEntityTooLarge()
        raw = request.environ.pop(BODY_READ_KEY, None)
        if raw is None:
            raw = _read_body(limit)
        try:
            body = orjson.loads(raw)
        except (ValueError, RecursionError):
            raise BadRequest("request body is not valid JSON") from None
        try:
            answer = answer_review(policy(), endpoint, body)
        except BadReview as exc:
            raise BadRequest(str(exc)) from None
    except HTTPException as exc:
        metrics.record(endpoint, "error", "unknown", None, time.perf_counter() - started)
        log.warning(
            "rejected admission request",
            extra={"endpoint": endpoint.value, "status": exc.code, "error": _describe(exc, limit)},
        )
        raise
    except Exception:
        metrics.record(endpoint, "error", "unknown", None, time.perf_counter() - started)
        raise  # no uid to answer: the error handler returns a JSON 500
    response = _json(answer.response)
    seconds = time.perf_counter() - started
    try:  # the answer is already decided: bookkeeping must not turn it into an HTTP 500
        metrics.record(endpoint, answer.outcome, _kind_label(answer.request), answer.decision, seconds)
        _log_decision(endpoint, answer, seconds)
    except Exception:
        log.exception("recording the decision for %s failed", answer.request.uid)
    return response


class _UnreadableInput:
    """Stands in for a request body whose reading failed, so Flask's path meets the same error."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def read(self, *_args: Any) -> bytes:
        raise self.error

    readline = read

    def readinto(self, _buffer: Any) -> int:
        raise self.error


class _ReviewFastPath:
    """WSGI middleware that answers a well-formed POST /mutate or /validate without Flask's request and
    response machinery (routing, request context, werkzeug wrappers), which cost more CPU than the
    policy itself (see BENCHMARKS.md). It only takes the plain case: a JSON Content-Type, a
    Content-Length within the limit, a body that is JSON and an AdmissionReview. Anything else, before
    a review is parsed, goes to the Flask app unchanged (the body already read is handed over), so every
    error status, message, metric and log line stays exactly what `_review` produces."""

    def __init__(self, flask_app: Callable[..., Any], routes: Mapping[str, Endpoint], policy: PolicySource,
                 metrics: Metrics, limit: int) -> None:
        self.flask_app = flask_app
        self.routes = dict(routes)
        self.policy = policy
        self.metrics = metrics
        self.limit = limit

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        endpoint = self.routes.get(environ.get("PATH_INFO", ""))
        if endpoint is None or environ.get("REQUEST_METHOD") != "POST":
            return self.flask_app(environ, start_response)
        started = time.perf_counter()
        length = _content_length(environ)
        if length is None or length > self.limit or not _is_json(environ.get("CONTENT_TYPE", "")):
            return self.flask_app(environ, start_response)
        stream = environ["wsgi.input"]
        try:
            raw = stream.read(length) if length else b""
        except Exception as exc:  # the Flask path reads again and meets the same error
            environ["wsgi.input"] = _UnreadableInput(exc)
            return self.flask_app(environ, start_response)
        try:
            answer = answer_review(self.policy(), endpoint, orjson.loads(raw)) if len(raw) == length else None
        except Exception:  # bad JSON, BadReview, a bug: Flask's path parses again and answers as ever
            answer = None
        if answer is None:
            # Hand the body over as it is: reading it again from a BytesIO would hold a second copy
            # (reviews may be ~19 MiB, see config.DEFAULT_MAX_REQUEST_BYTES).
            environ[BODY_READ_KEY] = raw
            environ["wsgi.input"] = io.BytesIO(b"")
            return self.flask_app(environ, start_response)
        body = orjson.dumps(answer.response)
        seconds = time.perf_counter() - started
        try:  # as in _review: bookkeeping must not turn a decided answer into an error
            self.metrics.record(endpoint, answer.outcome, _kind_label(answer.request), answer.decision, seconds)
            _log_decision(endpoint, answer, seconds)
        except Exception:
            log.exception("recording the decision for %s failed", answer.request.uid)
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]


def _content_length(environ: Mapping[str, Any]) -> int | None:
    raw = environ.get("CONTENT_LENGTH")
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= 0 else None


def _is_json(content_type: str) -> bool:
    """werkzeug's Request.is_json on the raw header: application/json or application/*+json."""
    mimetype = content_type.split(";", 1)[0].strip().lower()
    return mimetype == "application/json" or (mimetype.startswith("application/") and mimetype.endswith("+json"))


def create_app(config: AppConfig) -> Flask:
    app = Flask("gpu_stack_webhook")
    # Werkzeug rejects a larger Content-Length up front and stops a chunked body at the limit.
    app.config["MAX_CONTENT_LENGTH"] = config.max_request_bytes
    policy = serving_policy(config.policy, config.policy_path, rules=config.rules, facts=config.facts)  # reloader.py
    metrics = Metrics()
    limit = config.max_request_bytes
    app.extensions["gpu_stack"] = {"policy": policy, "metrics": metrics, "config": config}

    @app.post("/mutate", provide_automatic_options=False)
    def mutate() -> Response:
        return _review(Endpoint.MUTATE, policy, metrics, limit)

    @app.post("/validate", provide_automatic_options=False)
    def validate() -> Response:
        return _review(Endpoint.VALIDATE, policy, metrics, limit)

    @app.get("/healthz")
    def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        try:
            ready = bool(config.readiness())
        except Exception as exc:
            log.warning("readiness check failed", extra={"error": f"{type(exc).__name__}: {exc}"})
            ready = False
        if not ready:
            return _json({"status": "not ready"}, 503)
        return _json({"status": "ready", "policy": config.policy_path or "<defaults>"})

    @app.get("/metrics")
    def metrics_endpoint() -> Response:
        return Response(metrics.render(), mimetype=None, content_type=CONTENT_TYPE_LATEST)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> BaseResponse:
        if isinstance(exc, RequestEntityTooLarge):
            exc.description = _describe(exc, limit)
        return _error_response(exc)

    @app.errorhandler(Exception)
    def unexpected_error(exc: Exception) -> BaseResponse:
        log.error("unhandled error on %s %s", request.method, request.path, exc_info=exc)
        return _error_response(InternalServerError("internal error"))

    routes = {"/mutate": Endpoint.MUTATE, "/validate": Endpoint.VALIDATE}
    app.wsgi_app = _ReviewFastPath(app.wsgi_app, routes, policy, metrics, limit)  # type: ignore[method-assign]
    return app


def _read_body(limit: int) -> bytes:
    """The body, at most `limit` bytes. Werkzeug already refused a larger Content-Length; for a body
    without one (chunked) its stream stops quietly at MAX_CONTENT_LENGTH, so one more byte from the
    server's own stream tells a body of exactly `limit` bytes from a longer one. Servers that set
    wsgi.input_terminated (gunicorn does) end that stream at the end of the body, so the probe never
    blocks; without it werkzeug never hands out more than Content-Length anyway."""
    raw = request.stream.read()
    if (
        len(raw) >= limit
        and request.environ.get("wsgi.input_terminated")
        and request.input_stream.read(1)
    ):
        raise RequestEntityTooLarge()
    return raw


def _describe(exc: HTTPException, limit: int) -> str:
    if isinstance(exc, RequestEntityTooLarge):
        return f"request body is larger than {limit} bytes"
    return exc.description or exc.name


def _log_decision(endpoint: Endpoint, answer: Answer, seconds: float) -> None:
    req, decision = answer.request, answer.decision
    fields: dict[str, Any] = {
        "uid": req.uid,
        "endpoint": endpoint.value,
        "kind": f"{req.group}/{req.kind}" if req.group else req.kind,
        "namespace": req.namespace,
        "object": req.display_name,
        "operation": req.operation,
        "dryRun": req.dry_run,
        "decision": answer.outcome,
        "allowed": decision.allowed,
        "rules": list(decision.rules),
        "duration_ms": round(seconds * 1000, 3),
    }
    if req.sub_resource:
        fields["subResource"] = req.sub_resource
    if decision.skipped:
        fields["skipped"] = decision.skipped
    if not decision.allowed:
        fields["code"] = decision.code
        fields["reason"] = decision.message
    if answer.decision.patch and endpoint is Endpoint.MUTATE:
        fields["patch_ops"] = len(decision.patch)
    if answer.error:
        fields["error"] = answer.error
    decision_log.info("admission decision", extra=fields)


def app_from_env() -> Flask:
    """WSGI entry for plain `gunicorn 'gpu_stack_webhook.server.app:app_from_env()'`: policy from
    $GPU_STACK_WEBHOOK_CONFIG."""
    return create_app(AppConfig.load())
