"""The AdmissionReview response (review.build_response, from a Decision by pipeline.response_of) against the
admission.k8s.io/v1 contract, the recorded responses, and what kubectl prints."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest
import yaml
from gpu_stack_webhook.admission.decide import Decision
from gpu_stack_webhook.admission.pipeline import response_of
from gpu_stack_webhook.admission.review import MAX_WARNING_CHARS, short_warning

from .podlib import GPU, container, make_pod, wrap
from .policylib import CONFIG_LABEL, config_mig, config_mps, config_per_node, decide
from .recordlib import FIXTURES, recorded, recorded_params

UID = "705ab4f5-6393-11e8-b7cc-42010a800002"
OPS = ({"op": "add", "path": "/spec/hostIPC", "value": True},)
VALIDATING = "validate.gpu-stack.io"


def body(decision: Decision, *, allow_patch: bool, uid: str = UID) -> dict[str, Any]:
    out = response_of(uid, decision, allow_patch=allow_patch)
    json.dumps(out)  # must be plain JSON
    return out


def decoded_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    return json.loads(base64.b64decode(response["response"]["patch"], validate=True))  # type: ignore[no-any-return]


# --- the envelope -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "decision",
    [
        pytest.param(Decision(allowed=True), id="allow"),
        pytest.param(Decision(allowed=False, code=403, message="no"), id="deny"),
        pytest.param(Decision(allowed=True, patch=OPS, warnings=("w",)), id="patch"),
    ],
)
@pytest.mark.parametrize("allow_patch", [True, False], ids=["mutate", "validate"])
def test_uid_apiversion_kind_echoed(decision: Decision, allow_patch: bool) -> None:
    # the apiserver rejects a response whose uid or apiVersion/kind differ from the request's
    out = body(decision, allow_patch=allow_patch, uid="abc-123")
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == "abc-123"
    assert out["response"]["allowed"] is decision.allowed


def test_allowed_has_no_status() -> None:
    # a plain allow: uid and allowed, nothing else
    assert body(Decision(allowed=True), allow_patch=True)["response"] == {"uid": UID, "allowed": True}


@pytest.mark.parametrize(
    ("code", "reason", "sent"),
    [
        pytest.param(403, "Forbidden", 403, id="403-forbidden"),
        pytest.param(400, "BadRequest", 400, id="400-badrequest"),
        pytest.param(500, "InternalError", 500, id="500-internalerror"),
        # a code with no reason mapping must still be a complete status, not "Error from server" without reason
        pytest.param(418, "Forbidden", 403, id="unknown-code-becomes-403"),
        # code 200 on a denial is nonsense -> 403
        pytest.param(200, "Forbidden", 403, id="200-on-denial-becomes-403"),
    ],
)
def test_denial_status(code: int, reason: str, sent: int) -> None:
    out = body(Decision(allowed=False, code=code, message="GPU002 nope"), allow_patch=False)
    assert out["response"]["status"] == {"code": sent, "reason": reason, "message": "GPU002 nope"}


def test_policy_denial_is_a_403_with_the_full_message() -> None:
    # a real denial from the engine: 403 Forbidden, status.message is the decision's message verbatim
    decision = decide(make_pod([container("x", gpu=1, privileged=True)]), "validate")
    status = body(decision, allow_patch=False)["response"]["status"]
    assert status["code"] == 403 and status["reason"] == "Forbidden"
    assert status["message"] == decision.message
    assert status["message"].startswith('GPU003 container "x" is privileged')


# --- warnings -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("short", "short", id="short-kept"),
        pytest.param("x" * 120, "x" * 120, id="exactly-120-kept"),
        pytest.param("x" * 121, "x" * 119 + "…", id="121-truncated"),
        pytest.param("y" * 500, "y" * 119 + "…", id="long-truncated"),
    ],
)
def test_warning_length(text: str, expected: str) -> None:
    # each kubectl Warning line <= 120 characters; truncation is visible as an ellipsis
    out = body(Decision(allowed=True, warnings=(text,)), allow_patch=False)
    assert out["response"]["warnings"] == [expected]
    assert len(out["response"]["warnings"][0]) <= MAX_WARNING_CHARS
    assert short_warning(text) == expected


MPS_AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": CONFIG_LABEL, "operator": "In", "values": ["mps-x10"]}]}]}}}

def _mig(n: int = 1) -> dict[str, Any]:
    return {"requests": {"nvidia.com/mig-1g.5gb": n}, "limits": {"nvidia.com/mig-1g.5gb": n}}


# (object, kind, endpoint, config): every kind of warning the policy emits, with its longest built-in reason
WARNING_CASES = [
    # GPU001 limit filled from the request
    pytest.param(make_pod([container("cuda", requests={GPU: 1})]), "Pod", "mutate", None, id="gpu001-fill"),
    # GPU002 envFrom without prefix
    pytest.param(make_pod([container("cuda", env_from=[{"configMapRef": {"name": "gpu-env"}}])]), "Pod", "validate",
                 None, id="gpu002-envfrom"),
    # GPU004 only some candidate configs refuse 2 replicas
    pytest.param(make_pod([container("cuda", gpu=2)]), "Pod", "validate", config_per_node(), id="gpu004-partial"),
    # GPU005 in migUnexposed: warn mode
    pytest.param(make_pod([container("cuda", resources=_mig())]), "Pod", "validate",
                 config_mig("single", rules={"migUnexposed": "warn"}), id="gpu005-warn"),
    # GPU006 hostIPC + toleration with the longest detection reason (affinity on the config label)
    pytest.param(make_pod([container("cuda", gpu=1)], affinity=MPS_AFFINITY), "Pod", "mutate", config_per_node(),
                 id="gpu006-affinity"),
    # GPU006 annotation opt-in: hostIPC, toleration and nodeSelector
    pytest.param(make_pod([container("cuda", gpu=1)], annotations={"gpu-stack.io/mps": "true"}), "Pod", "mutate",
                 None, id="gpu006-annotation"),
    # GPU006 template warning on a Deployment
    pytest.param(wrap(make_pod([container("cuda", gpu=1)], affinity=MPS_AFFINITY), "Deployment"), "Deployment",
                 "validate", config_per_node(), id="gpu006-template"),
]


@pytest.mark.parametrize(("obj", "kind", "endpoint", "config"), WARNING_CASES)
def test_real_warnings_fit_without_truncation(obj: dict[str, Any], kind: str, endpoint: str, config: Any) -> None:
    # what the policy really warns about reaches kubectl whole: <= 120 characters, one line, not cut
    decision = decide(obj, endpoint, config, kind=kind)
    assert decision.allowed and decision.warnings
    sent = body(decision, allow_patch=endpoint == "mutate")["response"]["warnings"]
    assert sent == list(decision.warnings), "a warning was truncated"
    for warning in sent:
        assert len(warning) <= MAX_WARNING_CHARS and "\n" not in warning


def test_no_warnings_key_without_warnings() -> None:
    assert "warnings" not in body(Decision(allowed=False, message="m"), allow_patch=False)["response"]


# --- patches ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("decision", "allow_patch", "has_patch"),
    [
        # /mutate, allowed with ops: JSONPatch sent
        pytest.param(Decision(allowed=True, patch=OPS), True, True, id="mutate-allowed-patch"),
        # /validate never sends a patch, whatever the decision holds
        pytest.param(Decision(allowed=True, patch=OPS), False, False, id="validate-never-patches"),
        # a denial never carries a patch
        pytest.param(Decision(allowed=False, code=403, message="m", patch=OPS), True, False, id="denied-no-patch"),
        # nothing to change: no patchType, no empty patch
        pytest.param(Decision(allowed=True), True, False, id="no-ops-no-patch"),
    ],
)
def test_patch_only_when_allowed_at_mutate(decision: Decision, allow_patch: bool, has_patch: bool) -> None:
    response = body(decision, allow_patch=allow_patch)["response"]
    assert ("patch" in response) is has_patch
    assert ("patchType" in response) is has_patch
    if has_patch:
        assert response["patchType"] == "JSONPatch"
        assert decoded_patch({"response": response}) == list(OPS)


def test_engine_patch_round_trips_through_base64() -> None:
    # the ops the engine decided are exactly the ops the apiserver decodes
    decision = decide(make_pod([container("cuda", requests={GPU: 1})], tolerations=[]), "mutate", config_mps())
    assert len(decision.patch) == 3
    assert decoded_patch(body(decision, allow_patch=True)) == list(decision.patch)


# --- auditAnnotations -----------------------------------------------------------------------------------


def test_audit_annotations() -> None:
    # the engine's audit map becomes auditAnnotations (keys without a prefix: the apiserver adds the webhook's)
    denial = decide(make_pod([container("x", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}])]), "validate")
    assert body(denial, allow_patch=False)["response"]["auditAnnotations"] == {"denied-by": "GPU002"}
    assert "auditAnnotations" not in body(Decision(allowed=True), allow_patch=True)["response"]
    for key, value in body(denial, allow_patch=False)["response"]["auditAnnotations"].items():
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", key) and isinstance(value, str)


# --- shapes of the recorded responses --------------------------------------------------------------------


def _shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    return type(value).__name__


def test_denial_has_the_recorded_shape() -> None:
    # our 403 has every key of the recorded 403 response with the same types (plus auditAnnotations)
    recorded_deny = recorded("responses/webhook-response-deny-403.json")
    ours = body(Decision(allowed=False, code=403, message="m", warnings=("w",), denied_by=("GPU002",)),
                allow_patch=False)
    theirs, mine = _shape(recorded_deny), _shape(ours)
    assert {k: v for k, v in mine.items() if k != "response"} == {k: v for k, v in theirs.items() if k != "response"}
    assert {k: v for k, v in mine["response"].items() if k != "auditAnnotations"} == theirs["response"]
    assert ours["response"]["warnings"] and isinstance(ours["response"]["warnings"], list)


@pytest.mark.parametrize("name", recorded_params("responses/webhook-response-patched-pod-*.json"))
def test_patch_has_the_recorded_shape(name: str) -> None:
    # our patched allow has the keys and types of the recorded patched responses (plus auditAnnotations)
    theirs = recorded(name)
    ours = body(Decision(allowed=True, patch=OPS, warnings=("w",), mutated=("GPU006",)), allow_patch=True)
    mine = _shape(ours)
    assert {k: v for k, v in mine["response"].items() if k != "auditAnnotations"} == _shape(theirs)["response"]
    # both patches decode as JSON lists of RFC 6902 ops
    for response in (theirs, ours):
        ops = decoded_patch(response)
        assert isinstance(ops, list) and all({"op", "path"} <= set(op) for op in ops)


# --- what kubectl prints ------------------------------------------------------------------------------------


def kubectl_output(response: dict[str, Any], *, source: str | None = None, webhook: str = VALIDATING) -> list[str]:
    """The lines kubectl prints for a webhook response, as in the recorded kubectl-*.txt: one `Warning:` line
    per warning, then for a denial `Error from server (<reason>): [error when creating "<file>": ]admission
    webhook "<name>" denied the request: <status.message>`."""
    r = response["response"]
    lines = [f"Warning: {w}" for w in r.get("warnings", [])]
    if not r["allowed"]:
        status = r.get("status") or {}
        head = f"Error from server ({status['reason']}): " if status.get("reason") else "Error from server: "
        where = f'error when creating "{source}": ' if source else ""
        what = f"denied the request: {status['message']}" if status.get("message") else \
            "denied the request without explanation"
        lines.append(f'{head}{where}admission webhook "{webhook}" {what}')
    return lines


@pytest.mark.parametrize(
    ("response_file", "kubectl_file", "source"),
    [
        pytest.param("webhook-response-deny-403.json", "kubectl-deny-403.txt", "pod-deny.yaml", id="apply-pod"),
        pytest.param("webhook-response-deny-403-run.json", "kubectl-deny-403-run.txt", None, id="run"),
        pytest.param("webhook-response-deny-403-deployment.json", "kubectl-deny-403-deployment.txt",
                     "deployment-deny.yaml", id="apply-deployment"),
        pytest.param("webhook-response-deny-nocode.json", "kubectl-deny-nocode.txt", "pod-deny.yaml", id="nocode"),
        pytest.param("webhook-response-deny-nostatus.json", "kubectl-deny-nostatus.txt", "pod-deny.yaml",
                     id="nostatus"),
    ],
)
def test_renderer_reproduces_recorded_kubectl_output(response_file: str, kubectl_file: str, source: str | None) -> None:
    # the rendering used below reproduces kubectl's real output byte for byte for every recorded denial
    response = recorded(f"responses/{response_file}")
    assert "\n".join(kubectl_output(response, source=source)) + "\n" == recorded(f"responses/{kubectl_file}")


def test_our_denial_as_kubectl_prints_it() -> None:
    # the recorded manifest pod-deny.yaml judged by our policy, rendered like kubectl-deny-403.txt
    manifest = yaml.safe_load(recorded("manifests/pod-deny.yaml"))
    decision = decide(manifest, "validate")
    out = body(decision, allow_patch=False)
    lines = kubectl_output(out, source="pod-deny.yaml")
    assert lines == [
        'Error from server (Forbidden): error when creating "pod-deny.yaml": admission webhook '
        '"validate.gpu-stack.io" denied the request: GPU002 container "x" sets NVIDIA_VISIBLE_DEVICES explicitly; '
        "GPUs are assigned by the device plugin, request nvidia.com/gpu instead (spec.containers[0].env[0])"
    ]
    # the same first words as the recorded line, so users and scripts matching on them keep working
    recorded_line = recorded("responses/kubectl-deny-403.txt").splitlines()[-1]
    prefix = 'Error from server (Forbidden): error when creating "pod-deny.yaml": admission webhook ' \
             '"validate.gpu-stack.io" denied the request: GPU002 container "x" sets NVIDIA_VISIBLE_DEVICES'
    assert recorded_line.startswith(prefix) and lines[0].startswith(prefix)


def test_our_denial_with_warnings_as_kubectl_prints_it() -> None:
    # a denial with a warning: `Warning: gpu-stack GPUnnn: ...` lines first, then one Error line
    pod = make_pod([container("x", gpu=1, privileged=True, env_from=[{"configMapRef": {"name": "gpu-env"}}])])
    lines = kubectl_output(body(decide(pod, "validate"), allow_patch=False))
    assert len(lines) == 2
    assert re.fullmatch(r"Warning: gpu-stack GPU002: [^\n]{1,100}", lines[0])
    assert re.fullmatch(r'Error from server \(Forbidden\): admission webhook "validate\.gpu-stack\.io" denied the '
                        r"request: GPU003 container \"x\" is privileged[^\n]*\(spec\.containers\[0\]\."
                        r"securityContext\.privileged\)", lines[1])


def test_many_violations_stay_on_one_error_line() -> None:
    # several violations: still exactly one Error line (no newline in status.message)
    pod = make_pod([container(f"c{i}", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]) for i in range(4)])
    lines = kubectl_output(body(decide(pod, "validate"), allow_patch=False))
    assert len(lines) == 1 and "denied the request: 4 GPU policy violations: [1] GPU002" in lines[0]


def test_apiserver_status_for_our_denial() -> None:
    # the apiserver wraps status.message into its own Status, like the recorded direct POST
    recorded_status = recorded("responses/apiserver-status-deny-403.json")
    theirs = recorded("responses/webhook-response-deny-403.json")["response"]
    assert recorded_status["response_body"]["message"] == (
        f'admission webhook "{VALIDATING}" denied the request: {theirs["status"]["message"]}')
    ours = body(decide(make_pod([container("x", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])]),
                       "validate"), allow_patch=False)["response"]
    # status code and reason are what the apiserver forwards as HTTP status and Status.reason
    assert (ours["status"]["code"], ours["status"]["reason"]) == (
        recorded_status["status"], recorded_status["response_body"]["reason"])


def test_fixtures_dir_points_at_the_shared_recordings() -> None:
    # guard against a silently wrong FIXTURES path: the recordings are in the repository (tests/fixtures)
    assert FIXTURES.is_dir(), f"{FIXTURES} absent (tests/fixtures/README.md)"
    assert (FIXTURES / "README.md").read_text(encoding="utf-8").startswith("# apiserver-v1.36 fixtures")


def test_each_patch_is_encoded_as_itself_when_patches_alternate() -> None:
    """build_response remembers the last patch it encoded (by identity): alternating patches, and an equal
    patch that is another object, are each encoded from their own operations."""
    first = ({"op": "add", "path": "/spec/hostIPC", "value": True},)
    second = ({"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"},)
    for patch in (first, second, first, tuple(dict(op) for op in second), first):
        encoded = body(Decision(allowed=True, patch=patch), allow_patch=True)["response"]["patch"]
        assert json.loads(base64.b64decode(encoded)) == list(patch)
