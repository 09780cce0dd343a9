"""Every AdmissionReview the real apiserver v1.36 sent (../shared/fixtures/apiserver-v1.36) gets the answer a user
expects; patches applied to the recorded object still give a schema-valid Pod."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from gpu_stack_webhook.admission import decide
from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.admission.pipeline import response_of
from gpu_stack_webhook.admission.review import parse_review
from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.engine import Policy

from .podlib import GPU, apply_patch
from .policylib import config_default, config_mps
from .recordlib import recorded, recorded_names, recorded_params

# The recorded apiserver is v1.36; kubernetes-validate ships that schema.
K8S_SCHEMA_VERSION = "1.36.0"
# Default policy, but only kube-system exempt, so the recordings in namespace gpu-stack are judged too.
POLICY_DATA = {"exemptNamespaces": ["kube-system"]}

ALLOW: dict[str, Any] = {"allowed": True}
# What the user sees per recorded file (stem): allowed, and for denials the code and the rule IDs in order;
# for patches the exact ops.
EXPECTED: dict[str, dict[str, Any]] = {
    # workloads with `limits nvidia.com/gpu: 1` only in the template: fine, never patched
    "cronjob-create-mutate": ALLOW,
    "cronjob-create-validate": ALLOW,
    # kubectl patch cronjob suspend=true: nothing new
    "cronjob-update-suspend-mutate": ALLOW,
    "cronjob-update-suspend-validate": ALLOW,
    "daemonset-create-mutate": ALLOW,
    "daemonset-create-validate": ALLOW,
    "deployment-create-mutate": ALLOW,
    "deployment-create-validate": ALLOW,
    # kubectl set env CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50: a harmless variable
    "deployment-update-mutate": ALLOW,
    "deployment-update-validate": ALLOW,
    "job-by-cronjob-mutate": ALLOW,
    "job-by-cronjob-validate": ALLOW,
    "job-create-mutate": ALLOW,
    "job-create-validate": ALLOW,
    "replicaset-by-controller-mutate": ALLOW,
    "replicaset-by-controller-validate": ALLOW,
    "statefulset-create-mutate": ALLOW,
    "statefulset-create-validate": ALLOW,
    # Pods created by controllers: requests were defaulted from limits, nothing to do
    "pod-by-cronjob-job-mutate": ALLOW,
    "pod-by-cronjob-job-validate": ALLOW,
    "pod-by-job-mutate": ALLOW,
    "pod-by-job-validate": ALLOW,
    "pod-by-replicaset-mutate": ALLOW,
    "pod-by-replicaset-validate": ALLOW,
    "pod-by-statefulset-mutate": ALLOW,
    "pod-by-statefulset-validate": ALLOW,
    # kubectl delete: 3 DELETE calls each, object null: always allowed
    "pod-delete-mutate": ALLOW,
    "pod-delete-validate": ALLOW,
    "pod-delete-call2-mutate": ALLOW,
    "pod-delete-call2-validate": ALLOW,
    "pod-delete-call3-mutate": ALLOW,
    "pod-delete-call3-validate": ALLOW,
    # NVIDIA_VISIBLE_DEVICES three ways: /mutate leaves it to /validate, which lists all three
    "pod-env-nvidia-visible-mutate": ALLOW,
    "pod-env-nvidia-visible-validate": {
        "allowed": False, "code": 403, "rules": ["GPU002", "GPU002", "GPU002"],
        "paths": ["spec.containers[0].env[0]", "spec.containers[0].envFrom[0]", "spec.initContainers[0].env[0]"],
    },
    # kubectl debug --profile=general (SYS_PTRACE, not privileged, no env): allowed
    "pod-ephemeral-debug-mutate": ALLOW,
    "pod-ephemeral-debug-validate": ALLOW,
    # --dry-run=server with generateName: judged like a real create, nothing wrong
    "pod-generatename-dryrun-mutate": ALLOW,
    "pod-generatename-dryrun-validate": ALLOW,
    "pod-gpu-limit-only-mutate": ALLOW,
    "pod-gpu-limit-only-validate": ALLOW,
    # requests only: /mutate fills the limit so the apiserver no longer answers 422 Invalid
    "pod-gpu-requests-only-mutate": {
        "allowed": True,
        "patch": [{"op": "add", "path": "/spec/containers/0/resources/limits", "value": {GPU: "1"}}],
        "warnings": ['gpu-stack GPU001: container "cuda": set GPU limit nvidia.com/gpu=1 from its request'],
    },
    # privileged GPU pod: Kubernetes accepts it, /validate denies
    "pod-privileged-gpu-mutate": ALLOW,
    "pod-privileged-gpu-validate": {
        "allowed": False, "code": 403, "rules": ["GPU003"], "paths": ["spec.containers[0].securityContext.privileged"],
    },
    # the same pod in gpu-stack (not exempt under this policy): /mutate still allows (PodSecurity denies later)
    "pod-privileged-gpu-psa-baseline-mutate": ALLOW,
    # kubectl label: UPDATE, nothing new
    "pod-update-labels-mutate": ALLOW,
    "pod-update-labels-validate": ALLOW,
}


def policy() -> Policy:
    return Policy(config_default(**POLICY_DATA))


def endpoint_of(name: str) -> Endpoint:
    return Endpoint.MUTATE if name.endswith("-mutate.json") else Endpoint.VALIDATE


def answer(body: dict[str, Any], endpoint: Endpoint, config: PolicyConfig | None = None) -> dict[str, Any]:
    request = parse_review(body)
    decision = decide.review((Policy(config) if config else policy()), request, endpoint)
    return response_of(request.uid, decision, allow_patch=endpoint is Endpoint.MUTATE)["response"]


def decoded(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response.get("patchType") == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))  # type: ignore[no-any-return]


def strict_valid_pod(obj: dict[str, Any]) -> None:
    """The Pod validates against the Kubernetes v1.36 Pod schema, strictly (no unknown fields). Nothing stripped."""
    kubernetes_validate.validate(obj, K8S_SCHEMA_VERSION, strict=True)


REVIEWS = recorded_params("admission-requests/*-mutate.json") + recorded_params("admission-requests/*-validate.json")


@pytest.mark.parametrize("name", REVIEWS)
def test_recorded_review(name: str) -> None:
    body = recorded(name)
    stem = Path(name).stem
    assert stem in EXPECTED, f"new recording {name}: add the verdict a user expects to EXPECTED"
    expected = EXPECTED[stem]
    response = answer(body, endpoint_of(name))
    assert response["uid"] == body["request"]["uid"]
    assert response["allowed"] is expected["allowed"], response.get("status")
    if not expected["allowed"]:
        status = response["status"]
        assert (status["code"], status["reason"]) == (expected["code"], "Forbidden")
        message = status["message"]
        rules, paths = expected["rules"], expected["paths"]
        if len(rules) > 1:
            assert message.startswith(f"{len(rules)} GPU policy violations: ")
        positions = [message.index(f"({p})") for p in paths]
        assert positions == sorted(positions), "violations are listed in spec order"
        for i, rule in enumerate(rules, 1):
            assert (f"[{i}] {rule} " in message) if len(rules) > 1 else message.startswith(f"{rule} ")
        assert response["auditAnnotations"] == {"denied-by": ",".join(dict.fromkeys(rules))}
    if "patch" in expected:
        assert decoded(response) == expected["patch"]
        patched = apply_patch(body["request"]["object"], expected["patch"])
        strict_valid_pod(patched)
        # the patched pod passes /validate and a reinvoked /mutate adds nothing
        again = json.loads(json.dumps(body))
        again["request"]["object"] = patched
        assert answer(again, Endpoint.VALIDATE)["allowed"] is True
        assert "patch" not in answer(again, Endpoint.MUTATE)
    else:
        assert "patch" not in response and "patchType" not in response
    assert response.get("warnings", []) == expected.get("warnings", [])


def test_every_expectation_has_a_recording() -> None:
    # the table does not describe files that are gone (a renamed recording would otherwise go untested)
    names = {Path(n).stem for n in recorded_names("admission-requests/*.json")}
    assert sorted(set(EXPECTED) - names) == []


def test_env_nvidia_visible_message_names_each_container() -> None:
    # the 3-violation denial names the init container and the main container, and how each sets it
    response = answer(recorded("admission-requests/pod-env-nvidia-visible-validate.json"), Endpoint.VALIDATE)
    message = response["status"]["message"]
    assert '[1] GPU002 container "main" sets NVIDIA_VISIBLE_DEVICES from valueFrom' in message
    assert '[2] GPU002 container "main" imports ConfigMap "gpu-env" with prefix "NVIDIA_"' in message
    assert '[3] GPU002 initContainer "init" sets NVIDIA_VISIBLE_DEVICES explicitly' in message


def test_gpu_stack_namespace_is_judged_with_this_policy_and_exempt_by_default() -> None:
    # pod-privileged-gpu-psa-baseline is in gpu-stack: judged (and denied at /validate) when only kube-system
    # is exempt; skipped by the default policy, which exempts the chart's own namespace
    body = recorded("admission-requests/pod-privileged-gpu-psa-baseline-mutate.json")
    assert body["request"]["namespace"] == "gpu-stack"
    request = parse_review(body)
    judged = decide.review(policy(), request, Endpoint.VALIDATE)
    assert not judged.allowed and judged.rules == ("GPU003",)
    default = decide.review(Policy(PolicyConfig()), request, Endpoint.VALIDATE)
    assert default.allowed and default.skipped == "namespace gpu-stack is exempt"


@pytest.mark.parametrize("name", recorded_params("admission-requests/pod-*-mutate.json"))
def test_recorded_pods_are_schema_valid_after_our_mutation(name: str) -> None:
    # whatever /mutate returns for a recorded Pod (under an MPS config, where every GPU pod is patched) applies
    # cleanly to the recorded object and leaves a strictly valid Pod
    body = recorded(name)
    obj = body["request"]["object"]
    response = answer(body, Endpoint.MUTATE, config_mps(**POLICY_DATA))
    if body["request"]["operation"] != "CREATE":
        # UPDATE (labels, kubectl debug) and DELETE are never patched, even for an MPS pod
        assert response["allowed"] is True and "patch" not in response
        return
    if "patch" in response:
        strict_valid_pod(apply_patch(obj, decoded(response)))
    strict_valid_pod(obj)


# --- the recorded MPS patch shapes --------------------------------------------------------------------------


def _index_patch(output: str) -> list[dict[str, Any]]:
    for entry in recorded("responses/index.json"):
        if entry.get("output") == output:
            return entry["webhook_patch_decoded"]  # type: ignore[no-any-return]
    raise AssertionError(f"{output} is not in responses/index.json")


@pytest.mark.parametrize("name", recorded_params("responses/patched-pod-*-mutate-request.json"))
@pytest.mark.parametrize("how", ["mps-config", "annotation"])
def test_recorded_mps_patch_shape(name: str, how: str) -> None:
    # the recorded requests behind kubectl-patched-pod-*.txt: an MPS pod gets a patch with the effect of the one
    # the apiserver accepted (hostIPC, then the toleration appended after DefaultTolerationSeconds' two)
    body = recorded(name)
    case = Path(name).stem.removesuffix("-mutate-request")
    if how == "mps-config":
        config = config_mps(**POLICY_DATA)
        extra: list[dict[str, Any]] = []
    else:
        body["request"]["object"]["metadata"].setdefault("annotations", {})["gpu-stack.io/mps"] = "true"
        config = config_default(**POLICY_DATA)
        # an annotation opt-in is also steered onto MPS nodes
        extra = [{"op": "add", "path": "/spec/nodeSelector", "value": {"nvidia.com/mps.capable": "true"}}]
    response = answer(body, Endpoint.MUTATE, config)
    assert response["allowed"] is True
    patched = apply_patch(body["request"]["object"], decoded(response))
    assert patched == apply_patch(body["request"]["object"], _index_patch(f"kubectl-{case}.txt") + extra)
    strict_valid_pod(patched)
    # what the apiserver stored equals our patched object in the fields we touched
    stored = recorded(f"responses/{case}.json")
    assert patched["spec"]["hostIPC"] is stored["spec"]["hostIPC"] is True
    assert patched["spec"]["tolerations"] == stored["spec"]["tolerations"]


def test_naive_replace_result_needs_nothing_more() -> None:
    # the pod stored after a naive whole-array patch (DefaultTolerationSeconds re-added its two): /validate allows
    # it and a reinvoked /mutate has nothing left to add
    body = recorded("responses/patched-pod-naive-replace-validate-request.json")
    config = config_mps(**POLICY_DATA)
    assert answer(body, Endpoint.VALIDATE, config)["allowed"] is True
    assert "patch" not in answer(body, Endpoint.MUTATE, config)


def test_never_append_to_an_absent_template_array() -> None:
    # kubectl-patch-append-missing-array.txt: appending /spec/template/spec/tolerations/- to a Deployment without
    # tolerations is an InternalError; we never patch workloads at all, even MPS ones
    manifest = yaml.safe_load(recorded("manifests/deployment-append.yaml"))
    manifest["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {GPU: 1}}
    body = {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                    "namespace": "gpu-demo", "operation": "CREATE", "object": manifest},
    }
    response = answer(body, Endpoint.MUTATE, config_mps(**POLICY_DATA))
    assert response["allowed"] is True and "patch" not in response
