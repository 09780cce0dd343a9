"""The one path from a request body to response bytes for POST /mutate and /validate.

`answer(endpoint, body, policy, ...)` owns every outcome of a review route, whoever calls it (the
server's WSGI dispatch, `gpu-stack-webhook check`, the tests), with one serialiser (orjson):

* 415: the Content-Type is not JSON (application/json or application/*+json);
* 413: the body is larger than the limit (declared by Content-Length, or read past it);
* 400: the body is not JSON, or not an admission.k8s.io/v1 AdmissionReview request;
* 500: an unexpected failure before the uid is known (nothing to answer it with);
* 200: an AdmissionReview response, also when the review failed once the uid was known: /validate
  then denies with code 500, /mutate allows unchanged with a warning (decide.internal_error).

Errors are JSON `{"error": ...}`. The `Reply` also carries the structured `Decision` (and the parsed
request) that metrics and the decision log read; nothing here logs except an unexpected exception.

A review goes down once and comes back once: review.py parses the request, decide.py makes the Decision
(running the policy), and review.py encodes the response from the decision's fields (`response_of`).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from gpu_stack_webhook.admission.decide import Decision, Endpoint, Outcome, internal_error, review
from gpu_stack_webhook.admission.review import AdmissionRequest, BadReview, build_response, parse_review
from gpu_stack_webhook.policy.engine import Policy

JSON = "application/json"
NOT_JSON = "request body is not valid JSON"

log = logging.getLogger("gpu_stack_webhook.admission.pipeline")


class Reply:
    """What to send (status, headers, body) and what was decided, for metrics and logs. Built once per
    request and not modified (a plain slotted class: compiled, cheaper than a NamedTuple; see review.py's
    AdmissionRequest)."""

    __slots__ = ("body", "decision", "error", "request", "status")

    def __init__(self, status: int, body: bytes, request: AdmissionRequest | None = None,
                 decision: Decision | None = None, error: str = "") -> None:
        self.status = status
        self.body = body
        # Set once the body was an AdmissionReview (status 200); None for 4xx and 500.
        self.request = request
        self.decision = decision
        # Why: the error text of a 4xx/500, or the exception behind a fail-closed decision.
        self.error = error

    def __repr__(self) -> str:
        return f"Reply({self.status}, {self.outcome}, {len(self.body)} bytes)"

    @property
    def headers(self) -> list[tuple[str, str]]:
        return [("Content-Type", JSON), ("Content-Length", str(len(self.body)))]

    @property
    def outcome(self) -> Outcome:
        return self.decision.outcome if self.decision is not None else "error"


def response_of(uid: str, decision: Decision, *, allow_patch: bool) -> dict[str, Any]:
    """The AdmissionReview response for `decision`; its patch only when `allow_patch` (/mutate)."""
    return build_response(uid, decision.allowed, code=decision.code, message=decision.message,
                          warnings=decision.warnings, patch=decision.patch if allow_patch else (),
                          audit=decision.audit)


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


def error_reply(status: int, message: str, error: str = "") -> Reply:
    return Reply(status, error_body(message), error=error or message)


def mimetype(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def is_json(content_type: str | None) -> bool:
    """werkzeug's Request.is_json on the raw header: application/json or application/*+json."""
    if content_type == JSON:  # what the API server sends
        return True
    kind = mimetype(content_type)
    return kind == JSON or (kind.startswith("application/") and kind.endswith("+json"))


def answer(
    endpoint: Endpoint,
    body: bytes,
    policy: Policy,
    *,
    content_type: str | None = JSON,
    limit: int | None = None,
    declared_length: int | None = None,
) -> Reply:
    """The reply to one POST of `body` (bytes as received) to `endpoint`. `limit` (default: the policy's
    maxRequestBytes) bounds the body; `declared_length` is its Content-Length, when the caller did not
    read a body declared larger than the limit (or read at most limit + 1 bytes of one without)."""
    if not is_json(content_type):
        return error_reply(415, f"Content-Type must be application/json, got {mimetype(content_type) or 'none'}")
    limit = policy.config.max_request_bytes if limit is None else limit
    if len(body) > limit or (declared_length is not None and declared_length > limit):
        return error_reply(413, f"request body is larger than {limit} bytes")
    try:
        document = orjson.loads(body)
    except (ValueError, RecursionError):  # orjson.JSONDecodeError is a ValueError; nesting past 1024 too
        return error_reply(400, NOT_JSON)
    return answer_document(endpoint, document, policy)


def answer_document(endpoint: Endpoint, document: Any, policy: Policy) -> Reply:
    """`answer` from the decoded JSON document on. `check` enters here with the object it read from
    YAML, which may hold what JSON cannot carry (`.inf`) and must still be judged, not turned into null."""
    try:
        request = parse_review(document)
    # One name per exception type: compiled (webhook/setup.py), a name keeps the type of its first binding.
    except BadReview as bad:
        return error_reply(400, str(bad))
    except Exception as bug:  # a parser bug: no uid to answer with
        log.exception("unexpected error reading a review for %s", endpoint.value)
        return error_reply(500, "internal error", f"{type(bug).__name__}: {bug}")
    allow_patch = endpoint is Endpoint.MUTATE
    try:
        decision = review(policy, request, endpoint)
        body = orjson.dumps(response_of(request.uid, decision, allow_patch=allow_patch))
        error = ""
    except Exception as failure:  # once the uid is known every failure is a fail-closed decision
        log.exception("unexpected error reviewing %s %s", endpoint.value, request.uid)
        decision = internal_error(endpoint)
        body = orjson.dumps(response_of(request.uid, decision, allow_patch=allow_patch))
        error = f"{type(failure).__name__}: {failure}"
    return Reply(200, body, request, decision, error)
