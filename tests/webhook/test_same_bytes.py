"""The same review gives the same bytes on every path: the pipeline function itself, the app
through Flask's test client (its WSGI dispatch), the real `gpu-stack-webhook serve` over TLS, and
`gpu-stack-webhook check` where it applies (the answered reviews; check has no HTTP errors)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.admission.pipeline import answer
from gpu_stack_webhook.admission.requests import admission_review
from gpu_stack_webhook.cli.main import check_object
from gpu_stack_webhook.policy.config import parse_config
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.server.app import AppConfig, create_app

from .podlib import GPU, container, make_pod
from .tls_helpers import Server, running_server

LIMIT = 16384
POLICY = {"maxRequestBytes": LIMIT}
NAMESPACE = "gpu-demo"
# Container names may be 63 characters: the GPU002 warning then runs past kubectl's 120 and is cut.
LONG_NAME = "a-container-with-a-rather-long-name-that-kubernetes-still-allows"


@dataclass(frozen=True)
class Case:
    endpoint: Endpoint
    body: bytes
    status: int
    content_type: str = "application/json"
    obj: dict[str, Any] | None = None  # what `check` reads, for the reviews it sends
    check_pass: int = 0  # which of check's replies (0 mutate, 1 validate) answers this review


def _review(obj: dict[str, Any], uid: str) -> bytes:
    return orjson.dumps(admission_review(obj, namespace=NAMESPACE, dry_run=True, uid=uid))


def _answered(endpoint: Endpoint, obj: dict[str, Any], uid: str) -> Case:
    return Case(endpoint, _review(obj, uid), 200, obj=obj, check_pass=0 if endpoint is Endpoint.MUTATE else 1)


ALLOWED = make_pod([container("cuda", gpu=1)], name="plain-gpu")
DENIED_WITH_LONG_WARNING = make_pod(
    [container(LONG_NAME, env_from=[{"configMapRef": {"name": "gpu-env"}}]), container("cuda", gpu=1, privileged=True)],
    name="privileged-and-long-warning",
)
PATCHED = make_pod([container("cuda", requests={GPU: "1"})], name="requests-only")
_valid = _review(ALLOWED, "u-large")

CASES = {
    "allowed": _answered(Endpoint.VALIDATE, ALLOWED, "u-allowed"),
    "denied-with-cut-warning": _answered(Endpoint.VALIDATE, DENIED_WITH_LONG_WARNING, "u-denied"),
    "patched": _answered(Endpoint.MUTATE, PATCHED, "u-patched"),
    "not-json": Case(Endpoint.VALIDATE, b"{not json", 400),
    "not-a-review": Case(Endpoint.MUTATE, b'{"apiVersion":"v1","kind":"Pod"}', 400),
    "too-large": Case(Endpoint.VALIDATE, _valid + b" " * (LIMIT + 1 - len(_valid)), 413),
    "wrong-content-type": Case(Endpoint.VALIDATE, _review(ALLOWED, "u-text"), 415, content_type="text/plain"),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("same-bytes"), POLICY) as srv:
        yield srv


def _pipeline(case: Case) -> tuple[int, str, bytes]:
    reply = answer(case.endpoint, case.body, Policy(parse_config(POLICY)), content_type=case.content_type)
    return reply.status, dict(reply.headers)["Content-Type"], reply.body


def _flask(case: Case) -> tuple[int, str, bytes]:
    client = create_app(AppConfig(policy=parse_config(POLICY))).test_client()
    reply = client.post(f"/{case.endpoint.value}", data=case.body, content_type=case.content_type)
    assert reply.headers["Content-Length"] == str(len(reply.data))
    return reply.status_code, reply.headers["Content-Type"], reply.data


def _served(server: Server, case: Case) -> tuple[int, str, bytes]:
    client = server.client()
    try:
        reply = client.request("POST", f"/{case.endpoint.value}", case.body, {"Content-Type": case.content_type})
    finally:
        client.close()
    assert reply.headers["Content-Length"] == str(len(reply.body))
    return reply.status, reply.content_type, reply.body


@pytest.mark.parametrize("name", list(CASES))
def test_the_same_review_gives_the_same_bytes_on_every_path(server: Server, name: str) -> None:
    case = CASES[name]
    expected = _pipeline(case)
    assert expected[0] == case.status
    assert expected[1] == "application/json"
    assert _flask(case) == expected
    assert _served(server, case) == expected
    if case.obj is not None:
        result = check_object(Policy(parse_config(POLICY)), case.obj, "manifest.yaml", NAMESPACE,
                              uid=orjson.loads(case.body)["request"]["uid"])
        assert result.replies[case.check_pass].body == expected[2]


def test_the_cut_warning_is_utf8_on_the_wire_not_an_escape() -> None:
    # The WSGI fast path (orjson) sent "…" and Flask's path (json.dumps) "\u2026" for the same warning.
    status, _, body = _pipeline(CASES["denied-with-cut-warning"])
    assert status == 200
    response = orjson.loads(body)["response"]
    assert response["allowed"] is False and response["status"]["code"] == 403
    (warning,) = response["warnings"]
    assert len(warning) == 120 and warning.endswith("…") and LONG_NAME in warning
    assert "…".encode() in body and b"\\u2026" not in body


def test_check_reads_the_answers_it_prints_from_those_bytes() -> None:
    result = check_object(Policy(parse_config(POLICY)), DENIED_WITH_LONG_WARNING, "pod.yaml", NAMESPACE)
    assert result.outcome == "denied"
    sent = orjson.loads(result.replies[1].body)["response"]
    assert result.warnings == sent["warnings"]
    assert result.errors == [
        'Error from server (Forbidden): error when creating "pod.yaml": admission webhook "validate.gpu-stack.io" '
        f'denied the request: {sent["status"]["message"]}'
    ]
