"""The application: a Flask app for probes, metrics and errors, with the review routes in front of it.

* POST /mutate, POST /validate: answered by admission/pipeline.py through the thin WSGI dispatch of
  review_routes.py (no Flask machinery on the review path); metrics.py counts and decision_log.py logs
  each reply from its structured decision.
* GET /healthz (alive), /readyz (config loaded and the readiness hook agrees), /metrics (Prometheus;
  aggregated over gunicorn workers when PROMETHEUS_MULTIPROC_DIR is set).
* Another method on /mutate or /validate: 405 with Allow: POST (review_routes.py, without Flask).
* Anything else is a JSON error from Flask: 404, 405 with Allow (POST /healthz), 500 `internal error`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from prometheus_client import CONTENT_TYPE_LATEST

from gpu_stack_webhook.admission.pipeline import JSON, error_body
from gpu_stack_webhook.policy.config import PolicyConfig, load_config
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.policy.facts import OFFLINE, ClusterFacts
from gpu_stack_webhook.policy.rules import RULES, Rule
from gpu_stack_webhook.server.live_policy import DEFAULT_INTERVAL, LivePolicy
from gpu_stack_webhook.server.metrics import Metrics, multiprocess_dir
from gpu_stack_webhook.server.reloader import PolicySource, serving_policy
from gpu_stack_webhook.server.review_routes import ReviewRoutes
from gpu_stack_webhook.settings import WebhookSettings, load_settings

if TYPE_CHECKING:
    from flask import Flask, Response
    from werkzeug.exceptions import HTTPException
    from werkzeug.wrappers import Response as BaseResponse

log = logging.getLogger("gpu_stack_webhook.server.app")


class LiveReader(Protocol):
    """kube/live.py OperatorReader, DevicePluginReader."""

    def __call__(self, base: PolicyConfig) -> PolicyConfig: ...

    def describe(self) -> str: ...


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
    # The environment (settings.py): reload interval, metrics directory, policy path for `load`.
    settings: WebhookSettings = field(default_factory=load_settings)
    # `serve --policy-source`: the reader of the live configuration the policy follows (kube/live.py),
    # read every `live_interval` seconds (server/live_policy.py); None: the policy file alone.
    live: LiveReader | None = None
    live_interval: float = DEFAULT_INTERVAL
    # The Policy of `policy`, `rules` and `facts` when the caller has built it already (`serve` does, to
    # refuse a bad policy before binding): served as it is instead of being built again.
    built: Policy | None = None

    @property
    def max_request_bytes(self) -> int:
        return self.policy.max_request_bytes

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, settings: WebhookSettings | None = None,
             **kwargs: Any) -> AppConfig:
        """Read the policy file at `path`, else $GPU_STACK_WEBHOOK_CONFIG, else built-in defaults.
        Raises ConfigError naming the bad key."""
        settings = settings or load_settings()
        resolved = str(path) if path else settings.policy_path
        return cls(policy=load_config(resolved), policy_path=resolved, settings=settings, **kwargs)


def _error_response(exc: HTTPException) -> BaseResponse:
    """Werkzeug's response for the error (keeps headers such as Allow on 405) with a JSON body."""
    response = exc.get_response()
    response.set_data(error_body(exc.description or exc.name))
    response.mimetype = JSON
    return response


def create_app(config: AppConfig) -> Flask:
    # Flask is imported here, where the app is built, not at the top: `gpu-stack-webhook inspect` and `check`
    # share cli/main.py with `serve` and never build it (Flask is about 60 ms of their start-up, -X importtime).
    from flask import Flask, Response, request  # noqa: PLC0415
    from werkzeug.exceptions import HTTPException, InternalServerError  # noqa: PLC0415

    def _json(payload: dict[str, Any], status: int = 200) -> Response:
        return Response(orjson.dumps(payload), status=status, mimetype=JSON)

    app = Flask("gpu_stack_webhook")
    # The review routes bound their bodies themselves (review_routes.py); this bounds Flask's routes.
    app.config["MAX_CONTENT_LENGTH"] = config.max_request_bytes
    policy: PolicySource
    metrics = Metrics(multiprocess_dir(config.settings.prometheus_multiproc_dir))
    if config.live is not None:
        policy = LivePolicy(config.policy_path, config.policy, config.live, interval=config.live_interval,
                            describe=config.live.describe(), built=config.built, rules=config.rules,
                            facts=config.facts, publish=metrics.publish_source_reads)
    else:
        policy = serving_policy(config.policy, config.policy_path, config.settings.reload_seconds,  # reloader.py
                                built=config.built, rules=config.rules, facts=config.facts)

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
        return _error_response(exc)

    @app.errorhandler(Exception)
    def unexpected_error(exc: Exception) -> BaseResponse:
        log.error("unhandled error on %s %s", request.method, request.path, exc_info=exc)
        return _error_response(InternalServerError("internal error"))

    app.wsgi_app = ReviewRoutes(app.wsgi_app, policy, metrics, config.max_request_bytes)  # type: ignore[method-assign]
    return app
