"""The Flask app from create_app, driven in-process with Flask's test client (fast, no TLS)."""

from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Iterable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from gpu_stack_webhook.admission import pipeline
from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.policy.config import PolicyConfig, parse_config
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.policy.rules import RULES, Rule
from gpu_stack_webhook.server.app import AppConfig, create_app
from gpu_stack_webhook.server.decision_log import DECISION_LOGGER
from gpu_stack_webhook.server.metrics import Metrics
from prometheus_client.parser import text_string_to_metric_families
from pythonjsonlogger.json import JsonFormatter

from .podlib import GPU, apply_patch, container, make_pod, review, wrap
from .recordlib import recorded, recorded_params

LIMIT = 4096


def make_client(**kw: Any) -> FlaskClient:
    policy = kw.pop("policy", None) or parse_config({"maxRequestBytes": LIMIT})
    return create_app(AppConfig(policy=policy, **kw)).test_client()


@pytest.fixture
def client() -> FlaskClient:
    return make_client()


def post(client: FlaskClient, path: str, body: Any, **kw: Any) -> Any:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    kw.setdefault("content_type", "application/json")
    return client.post(path, data=data, **kw)


def requests_only_pod() -> dict[str, Any]:
    return make_pod([container("cuda", requests={GPU: "1"})], name="requests-only")


def privileged_pod() -> dict[str, Any]:
    return make_pod([container("cuda", gpu=1, privileged=True)], name="privileged")


def metric_samples(client: FlaskClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    reply = client.get("/metrics")
    assert reply.status_code == 200
    assert reply.content_type.startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(reply.get_data(as_text=True)):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def sample(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


# --------------------------------------------------------------------------------------------------
# Answered reviews
# --------------------------------------------------------------------------------------------------


RECORDED_REVIEWS = [
    *recorded_params("admission-requests/*-mutate.json"),
    *recorded_params("admission-requests/*-validate.json"),
]


@pytest.mark.parametrize("name", RECORDED_REVIEWS)
def test_every_recorded_request_gets_an_admission_review_back(name: str) -> None:
    body = recorded(name)
    path = "/mutate" if name.endswith("-mutate.json") else "/validate"
    reply = post(make_client(policy=PolicyConfig()), path, body)
    assert reply.status_code == 200
    assert reply.content_type == "application/json"
    answer = reply.get_json()
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == body["request"]["uid"]
    assert isinstance(answer["response"]["allowed"], bool)
    if path == "/validate":
        assert "patch" not in answer["response"] and "patchType" not in answer["response"]


def test_mutate_returns_a_base64_jsonpatch_that_sets_the_missing_limit(client: FlaskClient) -> None:
    pod = requests_only_pod()
    answer = post(client, "/mutate", review(pod, uid="u-1")).get_json()["response"]
    assert answer["allowed"] is True
    assert answer["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(answer["patch"]))
    patched = apply_patch(pod, ops)
    assert patched["spec"]["containers"][0]["resources"]["limits"] == {GPU: "1"}
    assert any("GPU001" in w for w in answer["warnings"])
    assert answer["auditAnnotations"] == {"mutations": "GPU001"}


def test_validate_never_carries_a_patch_even_for_what_mutate_would_patch(client: FlaskClient) -> None:
    answer = post(client, "/validate", review(requests_only_pod())).get_json()["response"]
    assert "patch" not in answer and "patchType" not in answer
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 403


def test_validate_denial_is_403_forbidden_with_the_rule_message(client: FlaskClient) -> None:
    answer = post(client, "/validate", review(privileged_pod(), uid="u-2")).get_json()["response"]
    assert answer["uid"] == "u-2"
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 403
    assert answer["status"]["reason"] == "Forbidden"
    assert answer["status"]["message"].startswith("GPU003 ")
    assert answer["auditAnnotations"] == {"denied-by": "GPU003"}


def test_object_that_is_not_a_pod_is_denied_with_code_400(client: FlaskClient) -> None:
    body = review({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": "nope"}})
    answer = post(client, "/validate", body).get_json()["response"]
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 400
    assert answer["status"]["reason"] == "BadRequest"


def test_a_kind_we_do_not_judge_is_allowed_untouched(client: FlaskClient) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "gpu-demo"}}
    for path in ("/mutate", "/validate"):
        answer = post(client, path, review(cm, kind="ConfigMap")).get_json()["response"]
        assert answer["allowed"] is True
        assert "patch" not in answer and "warnings" not in answer


@pytest.mark.parametrize("kind", ["Deployment", "CronJob"])
def test_workload_templates_are_judged_on_validate(client: FlaskClient, kind: str) -> None:
    answer = post(client, "/validate", review(wrap(privileged_pod(), kind))).get_json()["response"]
    assert answer["allowed"] is False
    assert "GPU003" in answer["status"]["message"]


# --------------------------------------------------------------------------------------------------
# Requests we cannot answer
# --------------------------------------------------------------------------------------------------


def _valid() -> dict[str, Any]:
    return review(make_pod())


def _without(key: str) -> dict[str, Any]:
    body = _valid()
    del body["request"][key]
    return body


BAD_BODIES = {
    "not-json": (b"{not json", 400, "not valid JSON"),
    "json-array": (b"[]", 400, "AdmissionReview"),
    "wrong-api-version": ({**_valid(), "apiVersion": "admission.k8s.io/v1beta1"}, 400, "admission.k8s.io/v1"),
    "wrong-kind": ({**_valid(), "kind": "Pod"}, 400, "AdmissionReview"),
    "no-request": ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, 400, "no request"),
    "no-uid": (_without("uid"), 400, "uid"),
    "no-operation": (_without("operation"), 400, "operation"),
    "deeply-nested": (b"[" * 100_000 + b"]" * 100_000, 413, "larger than"),
    "empty": (b"", 400, "not valid JSON"),
}


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_unreadable_reviews_are_json_4xx_errors(client: FlaskClient, path: str, case: str) -> None:
    body, status, text = BAD_BODIES[case]
    reply = post(client, path, body)
    assert reply.status_code == status
    assert reply.content_type == "application/json"
    assert text in reply.get_json()["error"]


def test_deeply_nested_json_within_the_limit_is_a_400_not_a_crash() -> None:
    client = make_client(policy=parse_config({"maxRequestBytes": 1_000_000}))
    reply = post(client, "/validate", b"[" * 200_000 + b"]" * 200_000)
    assert reply.status_code == 400
    assert reply.get_json() == {"error": "request body is not valid JSON"}


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_wrong_content_type_is_415(client: FlaskClient, content_type: str | None) -> None:
    reply = client.post("/validate", data=json.dumps(_valid()), content_type=content_type)
    assert reply.status_code == 415
    assert reply.content_type == "application/json"
    assert "application/json" in reply.get_json()["error"]


def test_json_with_charset_is_accepted(client: FlaskClient) -> None:
    reply = post(client, "/validate", _valid(), content_type="application/json; charset=utf-8")
    assert reply.status_code == 200


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize("method", ["GET", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"])
def test_another_method_on_a_review_endpoint_is_a_json_405_with_allow(client: FlaskClient, method: str,
                                                                       path: str) -> None:
    reply = client.open(path, method=method)
    assert reply.status_code == 405
    assert reply.content_type == "application/json"
    assert reply.headers["Allow"] == "POST"
    if method == "HEAD":
        assert reply.data == b"" and int(reply.headers["Content-Length"]) > 0
    else:
        assert reply.get_json() == {"error": "The method is not allowed for the requested URL."}


def test_a_wrong_method_elsewhere_is_flasks_405_with_the_same_body(client: FlaskClient) -> None:
    reply = client.post("/healthz")
    assert reply.status_code == 405
    assert set(reply.headers["Allow"].split(", ")) == {"GET", "HEAD", "OPTIONS"}
    assert reply.get_json() == {"error": "The method is not allowed for the requested URL."}


def test_unknown_path_is_a_json_404(client: FlaskClient) -> None:
    reply = client.post("/admit", data="{}", content_type="application/json")
    assert reply.status_code == 404
    assert reply.content_type == "application/json"
    assert "error" in reply.get_json()


def _exactly(size: int) -> bytes:
    """A valid AdmissionReview padded with trailing whitespace to exactly `size` bytes."""
    raw = json.dumps(review(make_pod())).encode()
    assert len(raw) <= size
    return raw + b" " * (size - len(raw))


def test_content_length_over_the_limit_is_413_before_reading(client: FlaskClient) -> None:
    reply = post(client, "/validate", _exactly(LIMIT + 1))
    assert reply.status_code == 413
    assert reply.get_json() == {"error": f"request body is larger than {LIMIT} bytes"}


def test_a_body_of_exactly_the_limit_is_answered(client: FlaskClient) -> None:
    assert post(client, "/validate", _exactly(LIMIT)).status_code == 200


@pytest.mark.parametrize(("size", "status"), [(LIMIT, 200), (LIMIT + 1, 413), (10 * LIMIT, 413)])
def test_a_body_without_content_length_is_limited_while_reading(client: FlaskClient, size: int, status: int) -> None:
    # What gunicorn hands over for a chunked body: no CONTENT_LENGTH, a stream it terminates itself.
    reply = client.post(
        "/validate",
        input_stream=io.BytesIO(_exactly(size)),
        content_type="application/json",
        environ_overrides={"wsgi.input_terminated": True},
    )
    assert reply.status_code == status


# --------------------------------------------------------------------------------------------------
# Failing closed
# --------------------------------------------------------------------------------------------------


def _crash(*_: Any) -> Iterable[Any]:
    raise ZeroDivisionError("boom")


CRASHING = Rule(id="GPU999", name="crashes", summary="always raises", check=_crash)


def test_a_crashing_rule_denies_on_validate_with_code_500() -> None:
    client = make_client(rules=(*RULES, CRASHING))
    answer = post(client, "/validate", review(make_pod(), uid="u-crash"))
    assert answer.status_code == 200
    response = answer.get_json()["response"]
    assert response["uid"] == "u-crash"
    assert response["allowed"] is False
    assert response["status"]["code"] == 500
    assert response["status"]["reason"] == "InternalError"
    assert "GPU999" in response["status"]["message"]


def test_a_crashing_rule_allows_on_mutate_with_a_warning_and_no_patch() -> None:
    client = make_client(rules=(*RULES, CRASHING))
    response = post(client, "/mutate", review(requests_only_pod())).get_json()["response"]
    assert response["allowed"] is True
    assert "patch" not in response
    assert any("GPU999" in w for w in response["warnings"])


class FailingLookups:
    """Cluster lookups whose adapter fails outside any rule (Policy.evaluate asks `online` before the
    rules run): an unexpected failure once the uid is known."""

    @property
    def online(self) -> bool:
        raise RuntimeError("unexpected failure outside the rules, with a secret detail")


def test_unexpected_error_after_parsing_fails_closed_on_validate() -> None:
    reply = post(make_client(facts=FailingLookups()), "/validate", review(make_pod(), uid="u-err"))
    assert reply.status_code == 200
    response = reply.get_json()["response"]
    assert response["uid"] == "u-err"
    assert response["allowed"] is False
    assert response["status"]["code"] == 500
    assert response["status"]["reason"] == "InternalError"
    assert "secret detail" not in reply.get_data(as_text=True)


def test_unexpected_error_after_parsing_allows_unchanged_on_mutate() -> None:
    response = post(make_client(facts=FailingLookups()), "/mutate", review(requests_only_pod())).get_json()["response"]
    assert response["allowed"] is True
    assert "patch" not in response
    assert response["warnings"] == ["gpu-stack: internal error; the object was not mutated"]


class Exploding:
    """A value that fails when compared: a bug in reading the envelope, before the uid is known (`check`
    hands answer_document whatever it read)."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("parser bug")

    __ne__ = __eq__  # type: ignore[assignment]
    __hash__ = None  # type: ignore[assignment]


def test_unexpected_error_before_the_uid_is_known_is_a_json_500() -> None:
    document = {**_valid(), "apiVersion": Exploding()}
    reply = pipeline.answer_document(Endpoint.VALIDATE, document, Policy(parse_config({})))
    assert (reply.status, reply.body, reply.request, reply.decision) == (500, b'{"error":"internal error"}', None, None)
    assert dict(reply.headers)["Content-Type"] == "application/json"
    assert reply.error == "RuntimeError: parser bug"


# --------------------------------------------------------------------------------------------------
# Health, readiness, metrics, logs
# --------------------------------------------------------------------------------------------------


def test_healthz(client: FlaskClient) -> None:
    reply = client.get("/healthz")
    assert reply.status_code == 200
    assert reply.get_json() == {"status": "ok"}


def test_readyz_follows_the_readiness_hook() -> None:
    state = {"ready": False}
    client = make_client(readiness=lambda: state["ready"])
    assert client.get("/readyz").status_code == 503
    state["ready"] = True
    assert client.get("/readyz").status_code == 200


def test_readyz_is_503_when_the_hook_raises() -> None:
    def broken() -> bool:
        raise OSError("certificate not mounted yet")

    reply = make_client(readiness=broken).get("/readyz")
    assert reply.status_code == 503
    assert reply.get_json() == {"status": "not ready"}


def test_app_config_load_reads_the_policy_file(tmp_path: Any) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("maxRequestBytes: 2048\n")
    config = AppConfig.load(path)
    assert config.max_request_bytes == 2048
    assert config.policy_path == str(path)
    app: Flask = create_app(config)
    assert app.config["MAX_CONTENT_LENGTH"] == 2048


def test_metrics_count_decisions_findings_and_durations(client: FlaskClient) -> None:
    post(client, "/validate", review(privileged_pod()))
    post(client, "/validate", review(privileged_pod()))
    post(client, "/mutate", review(requests_only_pod()))
    post(client, "/validate", review({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}, kind="Secret"))
    post(client, "/validate", b"nope")
    samples = metric_samples(client)
    reviews = "gpu_stack_admission_reviews_total"
    assert sample(samples, reviews, endpoint="validate", decision="denied", kind="Pod") == 2
    assert sample(samples, reviews, endpoint="mutate", decision="patched", kind="Pod") == 1
    assert sample(samples, reviews, endpoint="validate", decision="skipped", kind="other") == 1
    assert sample(samples, reviews, endpoint="validate", decision="error", kind="unknown") == 1
    findings = "gpu_stack_rule_findings_total"
    assert sample(samples, findings, endpoint="validate", rule="GPU003", severity="deny") == 2
    assert sample(samples, findings, endpoint="mutate", rule="GPU001", severity="warn") == 1
    assert sample(samples, "gpu_stack_admission_duration_seconds_count", endpoint="validate") == 4
    assert sample(samples, "gpu_stack_admission_duration_seconds_count", endpoint="mutate") == 1
    buckets = {dict(labels).get("le") for (name, labels) in samples if name.endswith("_bucket")}
    assert {"0.0005", "1.0", "+Inf"} <= buckets


def test_two_apps_in_one_process_count_separately() -> None:
    first, second = make_client(), make_client()
    post(first, "/validate", review(privileged_pod()))
    samples = metric_samples(second)
    assert sample(samples, "gpu_stack_admission_reviews_total", endpoint="validate", decision="denied", kind="Pod") == 0


def test_one_json_log_line_per_decision_without_the_object(
    client: FlaskClient, caplog: pytest.LogCaptureFixture
) -> None:
    body = review(privileged_pod(), uid="u-log", dry_run=True)
    with caplog.at_level(logging.INFO, logger=DECISION_LOGGER):
        post(client, "/validate", body)
    records = [r for r in caplog.records if r.name == DECISION_LOGGER]
    assert len(records) == 1
    line = JsonFormatter("%(levelname)s %(name)s %(message)s").format(records[0])
    entry = json.loads(line)
    assert entry["uid"] == "u-log"
    assert entry["endpoint"] == "validate"
    assert entry["kind"] == "Pod"
    assert entry["namespace"] == "gpu-demo"
    assert entry["object"] == "gpu-demo/privileged"
    assert entry["operation"] == "CREATE"
    assert entry["dryRun"] is True
    assert entry["decision"] == "denied"
    assert entry["rules"] == ["GPU003"]
    assert isinstance(entry["duration_ms"], float)
    assert "nvcr.io" not in line and '"spec"' not in line and "metadata" not in line


def test_the_log_line_says_why_a_request_was_skipped(client: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=DECISION_LOGGER):
        post(client, "/validate", review(make_pod(namespace="kube-system")))
    (record,) = [r for r in caplog.records if r.name == DECISION_LOGGER]
    assert record.decision == "skipped"  # type: ignore[attr-defined]
    assert record.skipped == "namespace kube-system is exempt"  # type: ignore[attr-defined]


def test_a_failing_metrics_backend_does_not_lose_the_answer(
    client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first review of a label set creates its values (in multiprocess mode, entries in the metrics
    directory's files): when that fails, the answer still goes out."""

    def broken(*args: Any) -> None:
        raise OSError("metrics directory vanished")

    metrics: Metrics = client.application.wsgi_app.metrics  # type: ignore[attr-defined]
    monkeypatch.setattr(metrics.reviews, "labels", broken)
    reply = post(client, "/validate", review(privileged_pod(), uid="u-metrics"))
    assert reply.status_code == 200
    assert reply.get_json()["response"]["status"]["code"] == 403
