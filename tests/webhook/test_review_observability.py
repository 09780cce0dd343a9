"""Metrics and the decision log read the structured decision (rule IDs by role, outcome), not its text;
INFO carries denials, warnings and errors, DEBUG the allowed, patched and skipped reviews."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

import pytest
from flask.testing import FlaskClient
from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.admission.pipeline import answer
from gpu_stack_webhook.policy.config import parse_config
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.policy.rules import RULES, Rule
from gpu_stack_webhook.server.app import AppConfig, create_app
from gpu_stack_webhook.server.decision_log import DECISION_LOGGER
from prometheus_client.parser import text_string_to_metric_families

from .podlib import GPU, container, make_pod, review

LONG_NAME = "a-container-with-a-rather-long-name-that-kubernetes-still-allows"
DENIED_AND_WARNED = make_pod(
    [container(LONG_NAME, env_from=[{"configMapRef": {"name": "gpu-env"}}]), container("cuda", gpu=1, privileged=True)],
    name="denied-and-warned",
)
WARNED = make_pod([container("app", env_from=[{"configMapRef": {"name": "gpu-env"}}])], name="warned")


def _crash(*_: Any) -> Iterable[Any]:
    raise ZeroDivisionError("boom")


CRASHING = Rule(id="GPU999", name="crashes", summary="always raises", check=_crash)


def make_client(**kw: Any) -> FlaskClient:
    return create_app(AppConfig(policy=parse_config({"maxRequestBytes": 8192}), **kw)).test_client()


def post(client: FlaskClient, path: str, body: Any) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body)
    return client.post(path, data=data, content_type="application/json")


def findings(client: FlaskClient) -> dict[tuple[str, str, str], float]:
    text = client.get("/metrics").get_data(as_text=True)
    return {(s.labels["endpoint"], s.labels["rule"], s.labels["severity"]): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "gpu_stack_rule_findings_total"}


def decision_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == DECISION_LOGGER]


# --- the decision ---------------------------------------------------------------------------------------


def test_the_reply_carries_the_rule_ids_by_role() -> None:
    reply = answer(Endpoint.VALIDATE, json.dumps(review(DENIED_AND_WARNED)).encode(), Policy(parse_config({})))
    decision = reply.decision
    assert decision is not None and reply.outcome == "denied"
    roles = (decision.denied_by, decision.warned, decision.mutated, decision.crashed)
    assert roles == (("GPU003",), ("GPU002",), (), "")
    assert dict(decision.severities()) == {"GPU003": "deny", "GPU002": "warn"}
    assert decision.audit == {"denied-by": "GPU003"}


def test_a_crashed_rule_is_named_and_counted_as_an_error() -> None:
    policy = Policy(parse_config({}), rules=(*RULES, CRASHING))
    reply = answer(Endpoint.VALIDATE, json.dumps(review(make_pod())).encode(), policy)
    assert reply.outcome == "error" and reply.decision is not None
    assert reply.decision.crashed == "GPU999" and dict(reply.decision.severities()) == {"GPU999": "error"}
    assert reply.decision.audit == {"internal-error": "GPU999"}


# --- metrics --------------------------------------------------------------------------------------------


def test_findings_are_counted_by_the_role_each_rule_played() -> None:
    client = make_client()
    post(client, "/validate", review(DENIED_AND_WARNED))
    post(client, "/mutate", review(make_pod([container("cuda", requests={GPU: "1"})])))
    assert findings(client) == {
        ("validate", "GPU003", "deny"): 1,
        ("validate", "GPU002", "warn"): 1,
        ("mutate", "GPU001", "warn"): 1,  # a change is counted as the warning kubectl shows for it
    }
    crashing = make_client(rules=(*RULES, CRASHING))
    post(crashing, "/validate", review(DENIED_AND_WARNED))
    assert findings(crashing) == {("validate", "GPU999", "error"): 1}  # the crash replaces the verdict


class FailingLookups:
    """Cluster lookups whose adapter fails outside any rule (Policy.evaluate asks `online` first)."""

    @property
    def online(self) -> bool:
        raise RuntimeError("unexpected")


def test_an_unexpected_failure_counts_as_an_error_review_without_a_rule() -> None:
    client = make_client(facts=FailingLookups())
    assert post(client, "/validate", review(make_pod())).get_json()["response"]["status"]["code"] == 500
    text = client.get("/metrics").get_data(as_text=True)
    assert 'gpu_stack_admission_reviews_total{decision="error",endpoint="validate",kind="Pod"} 1.0' in text
    assert findings(client) == {}


# --- the decision log -----------------------------------------------------------------------------------


def test_denials_and_warnings_are_info_lines_with_the_roles(caplog: pytest.LogCaptureFixture) -> None:
    client = make_client()
    with caplog.at_level(logging.INFO, logger=DECISION_LOGGER):
        post(client, "/validate", review(DENIED_AND_WARNED, uid="u-deny"))
        post(client, "/validate", review(WARNED, uid="u-warn"))
    denied, warned = decision_lines(caplog)
    assert denied.levelno == warned.levelno == logging.INFO
    assert (denied.uid, denied.decision, denied.denied_by, denied.warned, denied.code) == (  # type: ignore[attr-defined]
        "u-deny", "denied", ["GPU003"], ["GPU002"], 403)
    assert (warned.uid, warned.decision, warned.warned) == ("u-warn", "allowed", ["GPU002"])  # type: ignore[attr-defined]


def test_a_patch_is_a_debug_line_with_its_rules(caplog: pytest.LogCaptureFixture) -> None:
    """The audit log has the patch (our `mutations` annotation); the decision log at INFO does not repeat it."""
    client = make_client()
    body = review(make_pod([container("cuda", requests={GPU: "1"})]), uid="u-patch")
    with caplog.at_level(logging.INFO, logger=DECISION_LOGGER):
        answer = post(client, "/mutate", body).get_json()["response"]
    assert decision_lines(caplog) == []
    assert answer["auditAnnotations"] == {"mutations": "GPU001"}
    with caplog.at_level(logging.DEBUG, logger=DECISION_LOGGER):
        post(client, "/mutate", body)
    (patched,) = decision_lines(caplog)
    assert (patched.levelno, patched.uid, patched.decision, patched.mutated, patched.patch_ops) == (  # type: ignore[attr-defined]
        logging.DEBUG, "u-patch", "patched", ["GPU001"], 1)


def test_allowed_unchanged_and_skipped_reviews_are_debug_lines(caplog: pytest.LogCaptureFixture) -> None:
    client = make_client()
    allowed = review(make_pod([container("cuda", gpu=1)]), uid="u-allowed")
    skipped = review(make_pod(namespace="kube-system"), uid="u-skipped")
    with caplog.at_level(logging.INFO, logger=DECISION_LOGGER):
        post(client, "/validate", allowed)
        post(client, "/validate", skipped)
    assert decision_lines(caplog) == []
    with caplog.at_level(logging.DEBUG, logger=DECISION_LOGGER):
        post(client, "/validate", allowed)
        post(client, "/validate", skipped)
    lines = decision_lines(caplog)
    assert [(r.levelno, r.uid, r.decision) for r in lines] == [  # type: ignore[attr-defined]
        (logging.DEBUG, "u-allowed", "allowed"), (logging.DEBUG, "u-skipped", "skipped")]


def test_a_fail_closed_review_is_an_info_line_naming_the_failure(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=DECISION_LOGGER):
        post(make_client(facts=FailingLookups()), "/mutate", review(make_pod(), uid="u-fail"))
    (line,) = decision_lines(caplog)
    assert (line.uid, line.decision, line.allowed, line.crashed, line.error) == (  # type: ignore[attr-defined]
        "u-fail", "error", True, "webhook", "RuntimeError: unexpected")


def test_a_request_that_is_no_review_is_one_warning_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        assert post(make_client(), "/validate", b"{not json").status_code == 400
    (line,) = [r for r in caplog.records if r.name.startswith("gpu_stack_webhook")]
    assert line.levelno == logging.WARNING
    assert (line.endpoint, line.status, line.error) == ("validate", 400, "request body is not valid JSON")  # type: ignore[attr-defined]


class _BrokenStream:
    def read(self, *_: Any) -> bytes:
        raise OSError("connection reset while reading the body")


def test_a_body_that_cannot_be_read_is_a_json_500() -> None:
    reply = make_client().post("/validate", data=b"x" * 100, content_type="application/json",
                               environ_overrides={"wsgi.input": _BrokenStream()})
    assert reply.status_code == 500
    assert reply.get_json() == {"error": "internal error"}
