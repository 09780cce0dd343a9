"""POST /mutate and /validate as a thin WSGI dispatch in front of the Flask app.

Flask's request and response machinery (routing, request context, werkzeug wrappers) cost more CPU
than the policy itself (BENCHMARKS.md), so a review never goes through it: this reads the body,
hands it to admission/pipeline.py (which owns every status and byte of the answer), counts it, logs
it and sends the reply. Another method on these paths is answered here too: 405 with `Allow: POST` and
a JSON error, as Flask would answer it. Every other path goes to the Flask app unchanged.

Reading: a Content-Length over the limit is answered 413 without reading the body. A body without
one (chunked) is read up to limit + 1 bytes, which tells a body of exactly `limit` bytes from a
longer one; servers that set wsgi.input_terminated (gunicorn does) end that stream at the end of the
body, so the read never blocks. Without that flag and without a Content-Length there is no body the
WSGI spec lets us read (answered as an empty body: 400).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from werkzeug.http import HTTP_STATUS_CODES

from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.admission.pipeline import Reply, answer, error_reply
from gpu_stack_webhook.server.decision_log import log_reply
from gpu_stack_webhook.server.metrics import Metrics
from gpu_stack_webhook.server.reloader import PolicySource

ROUTES: Mapping[str, Endpoint] = {"/mutate": Endpoint.MUTATE, "/validate": Endpoint.VALIDATE}
# The status lines werkzeug would send ("413 REQUEST ENTITY TOO LARGE").
STATUS_LINES = {code: f"{code} {HTTP_STATUS_CODES[code].upper()}" for code in (200, 400, 405, 413, 415, 500)}
# werkzeug's MethodNotAllowed description, as the Flask app's JSON errors carry it.
METHOD_NOT_ALLOWED = error_reply(405, "The method is not allowed for the requested URL.")

log = logging.getLogger("gpu_stack_webhook.server.review_routes")

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def content_length(environ: Mapping[str, Any]) -> int | None:
    raw = environ.get("CONTENT_LENGTH")
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= 0 else None


def read_body(environ: Mapping[str, Any], declared: int | None, limit: int) -> bytes:
    """The body, at most limit + 1 bytes (see the module docstring); nothing when declared too large."""
    stream = environ["wsgi.input"]
    if declared is not None:
        return stream.read(declared) if 0 < declared <= limit else b""
    if environ.get("wsgi.input_terminated"):
        return stream.read(limit + 1)  # type: ignore[no-any-return]
    return b""


class ReviewRoutes:
    """WSGI middleware: POST /mutate and /validate answered by the pipeline, the rest by `app`."""

    def __init__(self, app: WsgiApp, policy: PolicySource, metrics: Metrics, limit: int) -> None:
        self.app = app
        self.policy = policy
        self.metrics = metrics
        self.limit = limit

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        endpoint = ROUTES.get(environ.get("PATH_INFO", ""))
        if endpoint is None:
            return self.app(environ, start_response)
        method = environ.get("REQUEST_METHOD")
        if method != "POST":
            start_response(STATUS_LINES[405], [*METHOD_NOT_ALLOWED.headers, ("Allow", "POST")])
            return [] if method == "HEAD" else [METHOD_NOT_ALLOWED.body]
        started = time.perf_counter()
        reply = self.reply(endpoint, environ)
        seconds = time.perf_counter() - started
        try:  # the answer is decided: bookkeeping must not turn it into an error
            self.metrics.record(endpoint, reply, seconds)
            log_reply(endpoint, reply, seconds)
        except Exception:
            log.exception("recording the reply to %s failed", endpoint.value)
        start_response(STATUS_LINES[reply.status], reply.headers)
        return [reply.body]

    def reply(self, endpoint: Endpoint, environ: Mapping[str, Any]) -> Reply:
        declared = content_length(environ)
        try:
            body = read_body(environ, declared, self.limit)
        except Exception as exc:  # the connection broke mid-body (gunicorn's chunk parser raises)
            log.exception("reading a request to %s failed", endpoint.value)
            return error_reply(500, "internal error", f"{type(exc).__name__}: {exc}")
        return answer(endpoint, body, self.policy(), content_type=environ.get("CONTENT_TYPE"), limit=self.limit,
                      declared_length=declared)
