"""The real thing: `gpu-stack-webhook serve` (gunicorn, 2 gthread workers) over TLS on a free port,
fed the AdmissionReview bodies a kube-apiserver v1.36 actually sent."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from .podlib import GPU, apply_patch, container, make_pod, review
from .recordlib import recorded
from .tls_helpers import (
    Client,
    Server,
    client_speaks_tls11,
    running_server,
    stop,
    tls11_client_context,
    wait_for_listening_workers,
)

LIMIT = 32768  # above every recorded request (the largest is ~14 KiB)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("webhook"), {"maxRequestBytes": LIMIT}) as srv:
        yield srv


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    c = server.client()
    yield c
    c.close()


def response_of(reply: Any) -> dict[str, Any]:
    assert reply.status == 200, reply.body
    assert reply.content_type == "application/json"
    body = reply.json
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["kind"] == "AdmissionReview"
    return body["response"]  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------------------
# Recorded apiserver requests
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "pod-gpu-limit-only-mutate.json",
        "pod-gpu-limit-only-validate.json",
        "pod-generatename-dryrun-mutate.json",
        "deployment-update-validate.json",
        "pod-ephemeral-debug-validate.json",
        "pod-delete-call3-mutate.json",
        "cronjob-create-validate.json",
    ],
)
def test_recorded_requests_are_allowed_with_uid_echoed(client: Client, name: str) -> None:
    body = recorded(f"admission-requests/{name}")
    path = "/mutate" if name.endswith("-mutate.json") else "/validate"
    response = response_of(client.post_json(path, body))
    assert response["uid"] == body["request"]["uid"]
    assert response["allowed"] is True


def test_recorded_requests_only_pod_is_patched_on_mutate(client: Client) -> None:
    body = recorded("admission-requests/pod-gpu-requests-only-mutate.json")
    response = response_of(client.post_json("/mutate", body))
    assert response["uid"] == body["request"]["uid"]
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    patched = apply_patch(body["request"]["object"], json.loads(base64.b64decode(response["patch"])))
    assert patched["spec"]["containers"][0]["resources"]["limits"] == {GPU: "1"}
    assert response["warnings"] == [
        'gpu-stack GPU001: container "cuda": set GPU limit nvidia.com/gpu=1 from its request'
    ]
    assert response["auditAnnotations"] == {"mutations": "GPU001"}


def test_the_same_body_on_validate_has_no_patch(client: Client) -> None:
    body = recorded("admission-requests/pod-gpu-requests-only-mutate.json")
    response = response_of(client.post_json("/validate", body))
    assert "patch" not in response and "patchType" not in response


def test_recorded_privileged_gpu_pod_is_denied_403(client: Client) -> None:
    body = recorded("admission-requests/pod-privileged-gpu-validate.json")
    response = response_of(client.post_json("/validate", body))
    assert response["uid"] == body["request"]["uid"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["reason"] == "Forbidden"
    assert response["status"]["message"].startswith('GPU003 container "cuda" is privileged')
    assert response["auditAnnotations"] == {"denied-by": "GPU003"}


def test_recorded_nvidia_visible_devices_pod_lists_every_violation(client: Client) -> None:
    body = recorded("admission-requests/pod-env-nvidia-visible-validate.json")
    response = response_of(client.post_json("/validate", body))
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert message.startswith("3 GPU policy violations: [1] GPU002")
    assert "; [2] GPU002 " in message and "; [3] GPU002 " in message


def test_an_object_that_is_not_a_pod_is_denied_400(client: Client) -> None:
    body = review({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}})
    response = response_of(client.post_json("/validate", body))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400


def test_a_kind_we_do_not_judge_is_allowed(client: Client) -> None:
    body = review({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}, kind="Service")
    for path in ("/mutate", "/validate"):
        response = response_of(client.post_json(path, body))
        assert response["allowed"] is True


# --------------------------------------------------------------------------------------------------
# HTTP behaviour
# --------------------------------------------------------------------------------------------------


def test_keep_alive_serves_many_reviews_on_one_tls_connection(client: Client) -> None:
    body = recorded("admission-requests/pod-gpu-limit-only-validate.json")
    for _ in range(6):
        reply = client.post_json("/validate", body)
        assert reply.status == 200
        assert reply.headers.get("Connection", "").lower() != "close"
    assert client.get("/healthz").status == 200
    assert client.connection.connects == 1


def test_an_error_reply_does_not_cost_the_connection(client: Client) -> None:
    assert client.post_json("/validate", b"{broken").status == 400
    assert client.post_json("/validate", b"x" * (LIMIT + 100)).status == 413
    assert client.post_json("/validate", review(make_pod())).status == 200
    assert client.connection.connects == 1


def _valid() -> dict[str, Any]:
    return review(make_pod())


BAD = {
    "not-json": ("POST", "/validate", b"not json", "application/json", 400),
    "wrong-api-version": ("POST", "/mutate", json.dumps({**_valid(), "apiVersion": "v1"}), "application/json", 400),
    "wrong-kind": ("POST", "/validate", json.dumps({**_valid(), "kind": "Status"}), "application/json", 400),
    "missing-request": (
        "POST", "/validate", json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
        "application/json", 400,
    ),
    "missing-uid": (
        "POST", "/validate",
        json.dumps({**_valid(), "request": {k: v for k, v in _valid()["request"].items() if k != "uid"}}),
        "application/json", 400,
    ),
    "wrong-content-type": ("POST", "/validate", json.dumps(_valid()), "text/plain", 415),
    "over-the-limit": ("POST", "/validate", b" " * (LIMIT + 1), "application/json", 413),
    "get-on-mutate": ("GET", "/mutate", None, None, 405),
    "put-on-validate": ("PUT", "/validate", json.dumps(_valid()), "application/json", 405),
    "unknown-path": ("POST", "/nope", json.dumps(_valid()), "application/json", 404),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_requests_get_json_errors(client: Client, case: str) -> None:
    method, path, body, content_type, status = BAD[case]
    headers = {"Content-Type": content_type} if content_type else {}
    reply = client.request(method, path, body, headers)
    assert reply.status == status
    assert reply.content_type == "application/json"
    assert set(reply.json) == {"error"}
    assert b"Traceback" not in reply.body and b"<html" not in reply.body.lower()


def test_chunked_body_over_the_limit_is_413(client: Client) -> None:
    reply = client.post_json("/validate", b" " * (3 * LIMIT), chunked=True)
    assert reply.status == 413
    assert reply.json == {"error": f"request body is larger than {LIMIT} bytes"}


def test_chunked_review_within_the_limit_is_answered(client: Client) -> None:
    body = recorded("admission-requests/pod-privileged-gpu-validate.json")
    response = response_of(client.post_json("/validate", json.dumps(body).encode(), chunked=True))
    assert response["allowed"] is False


def test_healthz_and_readyz(client: Client) -> None:
    assert client.get("/healthz").json == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status == 200
    assert ready.json["status"] == "ready"


def test_metrics_aggregate_every_worker(tmp_path: Path) -> None:
    """Requests on fresh connections are spread over both workers; /metrics (served by either one)
    must count all of them, which only multiprocess mode does. A worker writes its counts to its file
    when it serves /metrics and about once a second otherwise (metric_values.py), so a scrape may lag the
    other worker: once the total is there, every scrape agrees on it whichever worker serves it, the
    reviews, durations and findings add up to the same number, and both workers' files hold a part."""
    reviews = 20
    body = review(make_pod([container("cuda", gpu=1, privileged=True)], namespace="metrics-test"))
    with running_server(tmp_path) as server:  # its own server: every count below is this test's
        wait_for_listening_workers(server, 2)  # healthy means one worker answered: the other may not listen yet
        for _ in range(reviews):
            c = server.client()
            assert response_of(c.post_json("/validate", body))["allowed"] is False
            c.close()
        deadline = time.monotonic() + 30
        while (counted := _counts(_scrape(server)))["reviews"] < reviews and time.monotonic() < deadline:
            time.sleep(0.2)
        assert counted == {"reviews": reviews, "durations": reviews, "findings": reviews}
        for _ in range(4):  # whichever worker answers, the totals are the same
            assert _counts(_scrape(server)) == counted
        per_worker = [
            _counts(list(MultiProcessCollector.merge([str(f)])))["reviews"]
            for f in (tmp_path / "tmp").glob("gpu-stack-metrics-*/counter_*.db")
        ]
    assert len(per_worker) == 2 and all(per_worker) and sum(per_worker) == reviews, per_worker


def _scrape(server: Server) -> list[Metric]:
    c = server.client()
    reply = c.get("/metrics")
    c.close()
    assert reply.status == 200
    assert reply.content_type.startswith("text/plain")
    return list(text_string_to_metric_families(reply.body.decode()))


def _counts(families: list[Metric]) -> dict[str, float]:
    """The denied Pod reviews on /validate, their durations and their GPU003 findings."""
    wanted = {
        "reviews": ("gpu_stack_admission_reviews_total", {"endpoint": "validate", "decision": "denied", "kind": "Pod"}),
        "durations": ("gpu_stack_admission_duration_seconds_count", {"endpoint": "validate"}),
        "findings": ("gpu_stack_rule_findings_total", {"endpoint": "validate", "rule": "GPU003", "severity": "deny"}),
    }
    return {
        what: sum(s.value for family in families for s in family.samples if s.name == name and s.labels == labels)
        for what, (name, labels) in wanted.items()
    }


def test_metrics_show_findings_and_durations(client: Client) -> None:
    client.post_json("/validate", review(make_pod([container("cuda", gpu=1, privileged=True)])))
    text = client.get("/metrics").body.decode()
    assert 'gpu_stack_rule_findings_total{endpoint="validate",rule="GPU003",severity="deny"}' in text
    assert 'gpu_stack_admission_duration_seconds_bucket{endpoint="validate",le="0.0005"}' in text


def test_decisions_are_logged_as_json_lines_and_no_access_log(server: Server, client: Client) -> None:
    body = recorded("admission-requests/pod-privileged-gpu-validate.json")
    client.post_json("/validate", body)
    uid = body["request"]["uid"]
    stop_marker = server.log_records()
    mine = [r for r in stop_marker if r.get("uid") == uid and r.get("endpoint") == "validate"]
    assert mine, server.log()
    assert mine[-1]["decision"] == "denied"
    assert mine[-1]["object"] == "gpu-demo/privileged-gpu"
    assert "POST /validate" not in server.log()  # gunicorn's access log is off


# --------------------------------------------------------------------------------------------------
# TLS
# --------------------------------------------------------------------------------------------------


def _tls_version(server: Server, **context_kw: Any) -> str | None:
    context = server.client(**context_kw).context
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        return tls.version()


def test_tls_1_3_is_negotiated_by_default(server: Server) -> None:
    assert _tls_version(server) == "TLSv1.3"


def test_tls_1_2_clients_are_served(server: Server) -> None:
    assert _tls_version(server, maximum=ssl.TLSVersion.TLSv1_2) == "TLSv1.2"


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1], ids=["tls1.0", "tls1.1"])
def test_tls_1_1_and_older_are_refused(server: Server, version: ssl.TLSVersion) -> None:
    if not client_speaks_tls11(server.pki, version):
        pytest.skip(f"this OpenSSL cannot complete a {version.name} handshake even when the server allows it")
    context = tls11_client_context(server.pki, version)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw, pytest.raises(ssl.SSLError):
        context.wrap_socket(raw, server_hostname="localhost")


def test_plain_http_is_not_answered_as_http(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            data = raw.recv(1024)
        except ConnectionResetError:  # the failed handshake closes the connection with data unread
            data = b""
    assert not data.startswith(b"HTTP/1.1 200")


# --------------------------------------------------------------------------------------------------
# Lifecycle
# --------------------------------------------------------------------------------------------------


def test_sigterm_stops_cleanly_and_removes_the_metrics_dir(tmp_path: Path) -> None:
    with running_server(tmp_path) as srv:
        during = sorted(p.name for p in (tmp_path / "tmp").iterdir())
        c = srv.client()
        assert c.post_json("/validate", review(make_pod())).status == 200
        c.close()
        assert stop(srv) == 0
    assert any(name.startswith("gpu-stack-metrics-") for name in during)
    assert not [p for p in (tmp_path / "tmp").iterdir() if p.name.startswith("gpu-stack-metrics-")]
