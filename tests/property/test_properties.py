"""Property-based tests of the webhook, through the HTTP layer (Flask test client over create_app).

Invariants, for arbitrary input and for schema-valid pods under several policies:
- every body is answered with a valid AdmissionReview (uid echoed, apiVersion/kind) or a 4xx JSON
  `{"error": ...}`; never an HTTP 5xx. An in-band code 500 (the documented fail-closed internal error)
  is tolerated only for bodies that are not schema-valid objects, and never for a valid pod;
- every patch applies cleanly (jsonpatch, as the apiserver applies it) and the result is still a
  valid Pod against the strict Kubernetes schema; it changes the spec only, and only a patch changes the pod;
- mutation is idempotent: the mutated pod gets no further patch;
- mutation never makes the validating verdict worse: the denials on the mutated pod are a subset of
  those on the original, and no GPU001 denial is left (the missing-limit ones, which the fill fixes);
- when /mutate denies early, /validate denies the same object too.

Profiles and case counts: see conftest.py (`make fuzz` runs the long profile).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from functools import cache
from typing import Any

import jsonpatch
import pytest
from flask.testing import FlaskClient
from gpu_stack_webhook.policy.config import PolicyConfig, parse_config
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.policy.rules import RULES
from gpu_stack_webhook.server.app import AppConfig, create_app
from gpu_stack_webhook.server.decision_log import DECISION_LOGGER
from hypothesis import given
from hypothesis import strategies as st

from . import counting
from .schema import schema_errors
from .strategies import CONFIG_LABEL, arbitrary_json, corrupted, pods, review_body, reviews

API_VERSION = "admission.k8s.io/v1"
ENDPOINTS = ("/mutate", "/validate")


def _plugin(mig: str = "none", **sharing: Any) -> dict[str, Any]:
    return {"version": "v1", "flags": {"migStrategy": mig}, **({"sharing": sharing} if sharing else {})}


def _ts(replicas: int = 4, fail: bool = True, rename: bool = False) -> dict[str, Any]:
    return {"renameByDefault": rename, "failRequestsGreaterThanOne": fail,
            "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}


def _mps() -> dict[str, Any]:
    return {"resources": [{"name": "nvidia.com/gpu", "replicas": 10}]}


CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "time-slicing": {"sharing": {"configs": {"default": _plugin(timeSlicing=_ts())}}},
    "time-slicing-renamed": {"sharing": {"configs": {"default": _plugin(timeSlicing=_ts(rename=True))}}},
    "mps": {"sharing": {"configs": {"default": _plugin(mps=_mps())}}},
    "mig-mixed": {"sharing": {"configs": {"default": _plugin("mixed")}}, "rules": {"migUnexposed": "warn"}},
    "per-node": {"sharing": {"nodeConfigLabel": CONFIG_LABEL, "defaultConfig": "default", "configs": {
        "default": _plugin(), "ts-x4": _plugin(timeSlicing=_ts()),
        "ts-x4-lenient": _plugin(timeSlicing=_ts(fail=False)),
        "mps-x10": _plugin(mps=_mps()), "mig-mixed": _plugin("mixed"), "mig-single": _plugin("single")}}},
    "no-hostipc": {"sharing": {"configs": {"default": _plugin(mps=_mps())}}, "mps": {"injectHostIPC": False}},
    # The chart's runtime-class layout: only GPU pods run under the NVIDIA runtime.
    "runtime-class": {"nvidiaRuntimeIsDefault": False, "injectRuntimeClassName": "nvidia"},
    # DRA: sharing enabled, admin access and allocationMode All in one namespace, another GPU class list.
    "dra": {"nvidiaRuntimeIsDefault": False, "dra": {
        "gpuDeviceClasses": ["gpu.nvidia.com", "nic.example.com"], "sharingStrategies": ["MPS"],
        "adminAccessNamespaces": ["gpu-admin"], "allocationModeAllNamespaces": ["gpu-admin"],
        "mpsDefaultPinnedDeviceMemoryLimit": "8Gi"}},
}


@cache
def _config(name: str) -> PolicyConfig:
    return parse_config(CONFIGS[name], name)


@cache
def _client(name: str) -> FlaskClient:
    return create_app(AppConfig(policy=_config(name))).test_client()


@cache
def _policy(name: str) -> Policy:
    return Policy(_config(name))


config_names = st.sampled_from(sorted(CONFIGS))
NOT_MUTATING = tuple(rule for rule in RULES if not rule.mutating)


@cache
def _policy_of(name: str, rule_id: str) -> Policy:
    return Policy(_config(name), rules=[r for r in RULES if r.id == rule_id])


@pytest.fixture(autouse=True, scope="module")
def _quiet_logs() -> Iterator[None]:
    """One decision line per review would pile up in pytest's log capture over thousands of cases."""
    names = (DECISION_LOGGER, "gpu_stack_webhook.server.review_routes", "gpu_stack_webhook.admission.pipeline")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    yield
    for lg, level in zip(loggers, levels, strict=True):
        lg.setLevel(level)


def post(config: str, path: str, body: Any, *, raw: bytes | None = None,
         content_type: str = "application/json") -> tuple[int, Any]:
    data = raw if raw is not None else json.dumps(body).encode()
    reply = _client(config).post(path, data=data, content_type=content_type)
    assert reply.mimetype == "application/json", (reply.status_code, reply.data[:200])
    return reply.status_code, json.loads(reply.data)


def check_answer(status: int, answer: Any, body: Any, *, allow_internal_error: bool) -> dict[str, Any] | None:
    """The HTTP-level invariant; returns the AdmissionReview response when there is one."""
    assert status < 500, f"HTTP {status}: {answer}"
    if status != 200:
        assert 400 <= status < 500
        assert isinstance(answer, dict) and set(answer) == {"error"} and isinstance(answer["error"], str), answer
        return None
    assert answer["apiVersion"] == API_VERSION and answer["kind"] == "AdmissionReview", answer
    response = answer["response"]
    assert response["uid"] == body["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert response["status"]["code"] in (400, 403, 500) and isinstance(response["status"]["message"], str)
        if response["status"]["code"] == 500:
            assert allow_internal_error, f"internal error on a schema-valid object: {response}"
            assert "internal-error" in response.get("auditAnnotations", {})
    elif not allow_internal_error:
        assert "internal-error" not in response.get("auditAnnotations", {}), response
    for warning in response.get("warnings", []):
        assert isinstance(warning, str) and len(warning) <= 120
    if "patch" in response:
        assert response["patchType"] == "JSONPatch" and response["allowed"]
        assert isinstance(json.loads(base64.b64decode(response["patch"])), list)
    return dict(response)


def mutate(config: str, pod: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    body = review_body(pod)
    status, answer = post(config, "/mutate", body)
    response = check_answer(status, answer, body, allow_internal_error=False)
    assert response is not None
    patch = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    return response, patch


def denials(config: str, obj: dict[str, Any]) -> set[tuple[str, str]]:
    return {(f.rule_id, f.path) for f in _policy(config).evaluate(obj, str(obj["kind"])).denials}


# --- the HTTP layer under arbitrary input -------------------------------------------------------------

garbage_bodies = st.one_of(
    arbitrary_json,
    corrupted(reviews()),
    st.builds(lambda r, v: {**r, "request": v}, reviews(), arbitrary_json),
)


@given(body=garbage_bodies, endpoint=st.sampled_from(ENDPOINTS), config=config_names)
def test_any_json_body_is_answered_with_a_review_or_a_4xx(body: Any, endpoint: str, config: str) -> None:
    counting.tick()
    status, answer = post(config, endpoint, body)
    if status == 200:
        assert isinstance(body, dict) and isinstance(body.get("request"), dict)
    check_answer(status, answer, body, allow_internal_error=True)


@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode),
       content_type=st.sampled_from(("application/json", "text/plain", "", "application/merge-patch+json")),
       endpoint=st.sampled_from(ENDPOINTS))
def test_any_bytes_are_answered_with_a_4xx_or_a_review(raw: bytes, content_type: str, endpoint: str) -> None:
    counting.tick()
    reply = _client("default").post(endpoint, data=raw, content_type=content_type)
    assert reply.status_code < 500
    payload = json.loads(reply.data)
    if reply.status_code == 200:
        assert payload["kind"] == "AdmissionReview"
    else:
        assert set(payload) == {"error"}


@given(body=reviews(), endpoint=st.sampled_from(ENDPOINTS), config=config_names)
def test_schema_valid_reviews_are_answered_without_internal_error(body: dict[str, Any], endpoint: str,
                                                                   config: str) -> None:
    counting.tick()
    status, answer = post(config, endpoint, body)
    assert status == 200, answer
    response = check_answer(status, answer, body, allow_internal_error=False)
    assert response is not None
    request = body["request"]
    if endpoint == "/validate" or request["operation"] != "CREATE" or request["kind"]["kind"] != "Pod":
        assert "patch" not in response, "only a Pod CREATE on /mutate is ever patched"
    if request["operation"] == "DELETE":
        assert response["allowed"] and "warnings" not in response


# --- mutation ---------------------------------------------------------------------------------------------


@given(pod=pods(), config=config_names)
def test_patch_applies_cleanly_and_keeps_a_valid_pod(pod: dict[str, Any], config: str) -> None:
    counting.tick()
    assert schema_errors(pod) == [], "the generator must produce schema-valid pods"
    _, patch = mutate(config, pod)
    patched = jsonpatch.JsonPatch(patch).apply(pod)
    assert schema_errors(patched) == [], (patch, schema_errors(patched))
    # The rules change the pod spec only (GPU001 limits; GPU006 hostIPC, tolerations, nodeSelector; GPU008
    # runtimeClassName), and a patch is sent only when it changes the pod.
    assert all(op["path"].startswith("/spec/") for op in patch), patch
    assert patched["metadata"] == pod["metadata"], patch
    assert (patched != pod) == bool(patch), patch


@given(pod=pods(), config=config_names)
def test_mutation_is_idempotent(pod: dict[str, Any], config: str) -> None:
    counting.tick()
    _response, patch = mutate(config, pod)
    if not patch:
        return
    again, second = mutate(config, jsonpatch.JsonPatch(patch).apply(pod))
    assert second == [], f"second pass patched again: {second} after {patch}"
    assert again["allowed"]


@given(pod=pods(), config=config_names)
def test_mutation_never_adds_a_denial(pod: dict[str, Any], config: str) -> None:
    counting.tick()
    response, patch = mutate(config, pod)
    before = denials(config, pod)
    if not response["allowed"]:
        assert before, "/mutate denied early what /validate would allow"
        body = review_body(pod)
        _status, answer = post(config, "/validate", body)
        assert answer["response"]["allowed"] is False
        return
    after = denials(config, jsonpatch.JsonPatch(patch).apply(pod))
    assert after <= before, f"our patch added denials {after - before}"
    # Allowed by /mutate means no GPU001 mismatch or fraction (those deny early), so the only GPU001 denials
    # /validate can have had are missing limits (path ...resources.limits[<resource>]), which the fill fixes.
    assert not any(rule == "GPU001" for rule, _path in after), after


@given(pod=pods(), config=config_names)
def test_rules_declared_not_mutating_never_change_a_pod_nor_deny_early(pod: dict[str, Any], config: str) -> None:
    """/mutate skips them (rules/__init__.py MUTATING): they must report nothing the mutating pass keeps."""
    counting.tick()
    for rule in NOT_MUTATING:
        evaluation = _policy_of(config, rule.id).evaluate(pod, "Pod", can_patch=True)
        assert evaluation.patch == ()
        kept = [f for f in evaluation.findings if f.changed or f.on_mutate or f.deny_early]
        assert kept == [], (rule.id, kept)
