"""The bypass catalogue: every way around each rule we could think of, end to end.

Each case is an attack (its id and comment say what it tries) sent the way the apiserver sends it:
an AdmissionReview built by `gpu_stack_webhook.admission.requests.admission_review`, judged by
`admission.decide.review`, and the same body through the HTTP layer (create_app's test client) with the
same verdict. The rule
tests (test_rules_*.py) pin each rule's details; this file is the security-facing list. A new
bypass idea goes here first.

Expectations: (endpoint, allowed, the rule that must be named in the denial or "" for allowed). A rule's
own test file may list its cases as `BYPASSES` (tests/webhook/bypasslib.py): they run here too.
"""

from __future__ import annotations

import base64
import importlib
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from gpu_stack_webhook.admission import decide
from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.admission.requests import admission_review
from gpu_stack_webhook.admission.review import parse_review
from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.server.app import AppConfig, create_app

from .bypasslib import Attack, debug, ephemeral_update, gpu_main, template_update, with_env
from .podlib import (
    GPU,
    claim_ref,
    claim_spec,
    container,
    exactly,
    gpu_config,
    make_pod,
    resource_claim,
    with_claims,
    wrap,
)
from .policylib import config_default, config_mig, config_mps, config_time_slicing

VISIBLE = "NVIDIA_VISIBLE_DEVICES"
MIG = "nvidia.com/mig-1g.5gb"
CONFIGS = {"default": config_default, "time-slicing": config_time_slicing, "mps": config_mps,
           "mig-none": lambda: config_mig("none"),
           "vgpu": lambda: config_default(gpuResources={"names": ["nvidia.com/gpu", "nvidia.com/vgpu"]}),
           "source-unreadable": lambda: config_default(sourceError="ClusterPolicy cluster-policy does not exist"),
           # the GPU Operator's toolkit: NVIDIA_VISIBLE_DEVICES honoured from unprivileged containers
           "envvar-accepted": lambda: config_default(envvarWhenUnprivileged=True, nvidiaRuntimeIsDefault=False)}


@cache
def _config(name: str) -> PolicyConfig:
    return CONFIGS[name]()


@cache
def _client(name: str) -> FlaskClient:
    return create_app(AppConfig(policy=_config(name))).test_client()


CLEAN_GPU_POD = make_pod([gpu_main()])

CASES: dict[str, Attack] = {
    # ---- GPU001: GPU limits equal requests, whole numbers -----------------------------------------------
    # A fraction hidden in an init container (only the main containers checked?).
    "gpu001-fraction-in-init-container": Attack(
        make_pod([gpu_main()], init=[container("init", gpu="500m")]), rule="GPU001"),
    # A fraction in an ephemeral container added after admission.
    "gpu001-fraction-in-added-ephemeral-container": ephemeral_update(
        CLEAN_GPU_POD, debug(container("x", requests={GPU: "0.5"}, limits={GPU: "0.5"})), rule="GPU001"),
    # Spellings of one: "1", 1, "1000m", "1e0" and 1.0 are all the same quantity: not a mismatch.
    "gpu001-spellings-of-one-agree": Attack(
        make_pod([container("main", requests={GPU: "1"}, limits={GPU: "1000m"}),
                  container("b", requests={GPU: 1}, limits={GPU: "1e0"}),
                  container("c", requests={GPU: 1.0}, limits={GPU: 1})]), allowed=True),
    # Request 2 but limit "1000m": a mismatch spelled to look equal.
    "gpu001-mismatch-spelled-in-milli": Attack(
        make_pod([container("main", requests={GPU: "2"}, limits={GPU: "1000m"})]), rule="GPU001"),
    # Unicode digits ("１", fullwidth): the apiserver's Quantity decoding refuses the object before any
    # webhook sees it; should one arrive, it is read as the same 1 in request and limit: no gain.
    "gpu001-fullwidth-digit-is-not-a-bypass": Attack(make_pod([container("main", gpu="１")]), endpoint="mutate",
                                                     allowed=True),
    # A request without a limit in a Deployment template: nothing fills it in a template, denied.
    "gpu001-deployment-request-without-limit": Attack(
        wrap(make_pod([container("main", requests={GPU: 1})]), "Deployment"), rule="GPU001"),
    # Negative counts.
    "gpu001-negative-count": Attack(make_pod([container("main", gpu=-1)]), endpoint="mutate", rule="GPU001"),

    # ---- GPU002: NVIDIA_VISIBLE_DEVICES, every pod -----------------------------------------------------
    "gpu002-env-in-init-container": Attack(
        make_pod([container("main")], init=[container("init", env=[{"name": VISIBLE, "value": "all"}])]),
        rule="GPU002"),
    "gpu002-env-in-added-ephemeral-container": ephemeral_update(
        make_pod([container("main")]), debug(container("x", env=[{"name": VISIBLE, "value": "all"}])),
        rule="GPU002"),
    # The value comes from a ConfigMap key at run time: the name alone is enough.
    "gpu002-valueFrom-configmap": Attack(make_pod([with_env(
        {"name": VISIBLE, "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "all"}}})]), rule="GPU002"),
    "gpu002-valueFrom-fieldRef": Attack(make_pod([with_env(
        {"name": VISIBLE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['g']"}}})]), rule="GPU002"),
    # envFrom with a prefix that, with a ConfigMap key "VISIBLE_DEVICES", yields the variable.
    "gpu002-envFrom-prefix-NVIDIA_": Attack(make_pod([container("main", env_from=[
        {"prefix": "NVIDIA_", "configMapRef": {"name": "x"}}])]), rule="GPU002"),
    "gpu002-envFrom-prefix-N": Attack(make_pod([container("main", env_from=[
        {"prefix": "N", "secretRef": {"name": "x"}}])]), rule="GPU002"),
    # The whole name as a prefix: a key "" is not valid, but we do not rely on that.
    "gpu002-envFrom-prefix-whole-name": Attack(make_pod([container("main", env_from=[
        {"prefix": VISIBLE, "configMapRef": {"name": "x"}}])]), rule="GPU002"),
    # Without a prefix the ConfigMap may hold the key: cannot be seen offline, a warning (allowed).
    "gpu002-envFrom-no-prefix-warns": Attack(make_pod([container("main", env_from=[
        {"configMapRef": {"name": "x"}}])]), allowed=True),
    # Variable names are case-sensitive and the runtime reads the exact name: not a bypass.
    "gpu002-lowercase-name-is-another-variable": Attack(make_pod([with_env(
        {"name": VISIBLE.lower(), "value": "all"})]), allowed=True),
    # A pod without any GPU request: the variable alone grants GPUs.
    "gpu002-non-gpu-pod": Attack(make_pod([with_env({"name": VISIBLE, "value": "all"})]), rule="GPU002"),
    **{f"gpu002-{kind.lower()}-template": Attack(
        wrap(make_pod([with_env({"name": VISIBLE, "value": "all"})]), kind), rule="GPU002")
       for kind in ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "CronJob")},
    # A Deployment that was fine, updated to add the variable to its template.
    "gpu002-deployment-template-update": template_update(
        "Deployment", make_pod([container("main")]), make_pod([with_env({"name": VISIBLE, "value": "all"})]),
        rule="GPU002"),
    # A Deployment that already had one violation adds a second one: the new one is still denied.
    "gpu002-second-violation-on-update": template_update(
        "Deployment", make_pod([with_env({"name": VISIBLE, "value": "0"})]),
        make_pod([container("main", env=[{"name": VISIBLE, "value": "0"}]),
                  container("side", env=[{"name": VISIBLE, "value": "all"}])]), rule="GPU002"),
    # Dry-run requests are judged like real ones (kubectl apply --dry-run=server).
    "gpu002-dry-run": Attack(make_pod([with_env({"name": VISIBLE, "value": "all"})]), rule="GPU002",
                             review={"dry_run": True}),
    # /mutate denies what Kubernetes rejects anyway; GPU002 is judged by /validate (mutate lets it pass).
    "gpu002-mutate-passes-to-validate": Attack(make_pod([with_env({"name": VISIBLE, "value": "all"})]),
                                               endpoint="mutate", allowed=True),

    # ---- GPU003: no privileged container in a GPU pod ----------------------------------------------------
    "gpu003-privileged-init-container": Attack(
        make_pod([gpu_main()], init=[container("init", privileged=True)]), rule="GPU003"),
    "gpu003-privileged-ephemeral-container-added": ephemeral_update(
        CLEAN_GPU_POD, debug(container("x", privileged=True)), rule="GPU003"),
    # The GPU request sits only in an init container; the privileged one is the main container.
    "gpu003-gpu-only-in-init-container": Attack(
        make_pod([container("main", privileged=True)], init=[container("init", gpu=1)]), rule="GPU003"),
    # No GPU request at all, but the NVIDIA runtime class (every GPU visible through the runtime).
    "gpu003-runtime-class-without-request": Attack(
        make_pod([container("main", privileged=True)], runtimeClassName="nvidia"), rule="GPU003"),
    # Other nvidia.com/ resources make it a GPU pod too.
    **{f"gpu003-resource-{name.split('/')[1]}": Attack(
        make_pod([container("main", privileged=True, requests={name: 1}, limits={name: 1})]), rule="GPU003",
        config="mig-none" if "mig" in name else "default")
       for name in ("nvidia.com/gpu.shared", MIG)},
    # Any other NVIDIA name is a GPU only by configuration (gpuResources.names / prefixes).
    "gpu003-resource-vgpu-configured": Attack(
        make_pod([container("main", privileged=True, requests={"nvidia.com/vgpu": 1}, limits={"nvidia.com/vgpu": 1})]),
        rule="GPU003", config="vgpu"),
    # A privileged pod with nothing to do with GPUs is not ours to judge (Pod Security is).
    "gpu003-privileged-non-gpu-pod-allowed": Attack(make_pod([container("main", privileged=True)]), allowed=True),

    # SYS_ADMIN (any spelling) or ALL in a container without its own GPU: privileged to the NVIDIA runtime.
    "gpu003-sys-admin-sidecar": Attack(make_pod([gpu_main(), {**container("side"), "securityContext": {
        "capabilities": {"add": ["cap_sys_admin"]}}}]), rule="GPU003"),
    "gpu003-add-all-debug-container": ephemeral_update(CLEAN_GPU_POD, debug({**container("x"), "securityContext": {
        "capabilities": {"add": ["ALL"]}}}), rule="GPU003"),

    # ---- GPU008: GPU pods get the NVIDIA runtime class when configured -------------------------------------
    # Not configured (nvidia is the nodes' default runtime): nothing is injected, the pod is allowed.
    "gpu008-no-injection-by-default": Attack(CLEAN_GPU_POD, endpoint="mutate", allowed=True),

    # ---- GPU010: the live GPU configuration (GPU Operator, device plugin chart) cannot be read --------------
    # Any way of being a GPU pod is denied while the policy cannot know what the nodes expose.
    "gpu010-gpu-pod": Attack(CLEAN_GPU_POD, rule="GPU010", config="source-unreadable"),
    "gpu010-runtime-class-only": Attack(make_pod([container("main")], runtimeClassName="nvidia"), rule="GPU010",
                                        config="source-unreadable"),
    "gpu010-gpu-in-init-container": Attack(make_pod([container("main")], init=[container("i", gpu=1)]),
                                           rule="GPU010", config="source-unreadable"),
    # A pod without GPUs is not held up.
    "gpu010-cpu-pod-allowed": Attack(make_pod([container("main")]), allowed=True, config="source-unreadable"),

    # ---- GPU011: under the NVIDIA runtime class, a container without a GPU gets the ones its image names ----
    # (k8s-device-plugin #1605: every CUDA image sets NVIDIA_VISIBLE_DEVICES=all, invisible in the pod spec)
    "gpu011-runtime-class-no-request": Attack(make_pod([container("main")], runtimeClassName="nvidia"),
                                              rule="GPU011", config="envvar-accepted"),
    "gpu011-cuda-sidecar-beside-a-gpu": Attack(
        make_pod([container("main", gpu=1), container("side")], runtimeClassName="nvidia"), rule="GPU011",
        config="envvar-accepted"),
    "gpu011-init-container-without-gpu": Attack(
        make_pod([container("main", gpu=1)], init=[container("setup")], runtimeClassName="nvidia"), rule="GPU011",
        config="envvar-accepted"),
    "gpu011-debug-container": ephemeral_update(
        {**CLEAN_GPU_POD, "spec": {**CLEAN_GPU_POD["spec"], "runtimeClassName": "nvidia"}}, debug(container("x")),
        rule="GPU011", config="envvar-accepted"),
    # Every container with its own GPU, or no NVIDIA runtime class at all (CDI gives the GPUs): allowed.
    "gpu011-every-container-has-a-gpu": Attack(make_pod([container("main", gpu=1)], runtimeClassName="nvidia"),
                                               allowed=True, config="envvar-accepted"),
    "gpu011-cdi-without-runtime-class": Attack(make_pod([container("main", gpu=1), container("side")]),
                                               allowed=True, config="envvar-accepted"),

    # ---- GPU004: shared GPUs, one replica per container --------------------------------------------------
    "gpu004-two-shared-gpus": Attack(make_pod([container("main", gpu=2)]), rule="GPU004", config="time-slicing"),
    "gpu004-two-spelled-2000m": Attack(make_pod([container("main", gpu="2000m")]), rule="GPU004",
                                       config="time-slicing"),
    "gpu004-two-in-init-container": Attack(make_pod([container("main", gpu=1)], init=[container("i", gpu=2)]),
                                           rule="GPU004", config="time-slicing"),

    # ---- GPU005: MIG names the nodes expose ---------------------------------------------------------------
    "gpu005-mig-under-strategy-none": Attack(
        make_pod([container("main", requests={MIG: 1}, limits={MIG: 1})]), rule="GPU005", config="mig-none"),
    "gpu005-mig-in-init-container": Attack(
        make_pod([gpu_main()], init=[container("i", requests={MIG: 1}, limits={MIG: 1})]), rule="GPU005",
        config="mig-none"),

    # ---- GPU006: MPS pods get the toleration (unprocessed pods stay off tainted MPS nodes) ----------------
    # Selecting MPS nodes through required node affinity instead of nodeSelector still gets injected.
    "gpu006-mps-by-affinity-is-patched": Attack(
        make_pod([gpu_main()], affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "nvidia.com/mps.capable", "operator": "In", "values": ["true"]}]}]}}}),
        endpoint="mutate", allowed=True, patched=True),
    # An MPS-shared resource without any selector: patched too.
    "gpu006-mps-resource-is-patched": Attack(make_pod([gpu_main()]), endpoint="mutate", allowed=True,
                                             patched=True, config="mps"),
    # Opting in by annotation while pinning non-MPS nodes: denied early, not silently half-patched.
    "gpu006-opt-in-with-conflicting-selector": Attack(
        make_pod([gpu_main()], annotations={"gpu-stack.io/mps": "true"},
                 nodeSelector={"nvidia.com/mps.capable": "false"}), endpoint="mutate", rule="GPU006"),

    # ---- GPU007: device requests outside the device plugin ------------------------------------------------
    "gpu007-cdi-annotation": Attack(
        make_pod([container("main")], annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}), rule="GPU007"),
    "gpu007-cdi-annotation-in-deployment-template": Attack(
        wrap(make_pod([container("main")], annotations={"cdi.k8s.io/x": "nvidia.com/gpu=0"}), "Deployment"),
        rule="GPU007"),
    **{f"gpu007-mount-{label}": Attack(make_pod([container("main", mounts=[path])]), rule="GPU007")
       for label, path in (
           ("plain", "/var/run/nvidia-container-devices/all"),
           ("dir-itself", "/var/run/nvidia-container-devices"),
           ("no-separator", "/var/run/nvidia-container-devicesall"),
           ("dotdot", "/var/run/x/../nvidia-container-devices/0"),
           ("double-slash", "//var/run//nvidia-container-devices/GPU-1"),
           ("trailing-dot", "/var/run/nvidia-container-devices/./all"),
           ("relative", "var/run/nvidia-container-devices/all"),
       )},
    "gpu007-mount-in-init-container": Attack(
        make_pod([container("main")], init=[container("i", mounts=["/var/run/nvidia-container-devices/all"])]),
        rule="GPU007"),
    "gpu007-mount-in-added-ephemeral-container": ephemeral_update(
        make_pod([container("main")]), debug(container("x", mounts=["/var/run/nvidia-container-devices/all"])),
        rule="GPU007"),

    # ---- GPUs from Dynamic Resource Allocation (offline here: a claim cannot be read, fail closed) ---------
    "gpu003-dra-claim-privileged-unreadable": Attack(make_pod(
        [with_claims(container("main", privileged=True), "gpu")], resourceClaims=[claim_ref(template="one-gpu")]),
        rule="GPU003"),
    "gpu003-dra-claim-sys-admin-sidecar-unreadable": Attack(make_pod(
        [with_claims(container("main"), "gpu"),
         {**container("side"), "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}],
        resourceClaims=[claim_ref(claim="shared-gpu")]), rule="GPU003"),
    "gpu003-deviceclass-extended-resource-privileged": Attack(make_pod([container(
        "main", privileged=True, limits={"deviceclass.resource.kubernetes.io/gpu.nvidia.com": 1})]), rule="GPU003"),
    "gpu003-deviceclass-extended-resource-debug-container": ephemeral_update(
        make_pod([container("main", limits={"deviceclass.resource.kubernetes.io/mig.nvidia.com": 1})]),
        debug({**container("x"), "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}), rule="GPU003"),
    "gpu003-other-deviceclass-privileged-allowed": Attack(make_pod([container(
        "main", privileged=True, limits={"deviceclass.resource.kubernetes.io/nic.example.com": 1})]),
        allowed=True),
    "gpu009-admin-access": Attack(resource_claim(claim_spec(exactly(adminAccess=True))), rule="GPU009"),
    "gpu009-admin-access-first-available-alternative": Attack(resource_claim(claim_spec(
        {"name": "any", "firstAvailable": [{"name": "nic", "deviceClassName": "nic.example.com"},
                                           {"name": "gpu", "deviceClassName": "mig.nvidia.com",
                                            "adminAccess": True}]})), rule="GPU009"),
    "gpu009-allocation-mode-all-template": Attack(resource_claim(
        claim_spec(exactly(allocationMode="All")), template=True), rule="GPU009"),
    "gpu009-mps-not-enabled": Attack(resource_claim(claim_spec(
        exactly(), config=[gpu_config({"strategy": "MPS"})])), rule="GPU009"),
    "gpu009-malformed-opaque-parameters": Attack(resource_claim(claim_spec(
        exactly(), config=[{"opaque": {"driver": "gpu.nvidia.com", "parameters": "MPS"}}])), rule="GPU009"),
    "gpu009-admin-access-other-class-allowed": Attack(resource_claim(
        claim_spec(exactly(device_class="nic.example.com", adminAccess=True))), allowed=True),

    # ---- what is deliberately not judged (documented exemptions) --------------------------------------------
    # kube-system and the release namespace are exempt (no deadlock on install/upgrade); the webhook
    # configurations' namespaceSelector keeps them from being sent at all.
    "exempt-kube-system": Attack(make_pod([with_env({"name": VISIBLE, "value": "all"})]), allowed=True,
                                 review={"namespace": "kube-system"}),
    # Status updates cannot change the spec.
    "skipped-status-subresource": Attack(make_pod([with_env({"name": VISIBLE, "value": "all"})]), allowed=True,
                                         review={"operation": "UPDATE", "sub_resource": "status",
                                                 "old_object": make_pod([container("main")])}),
}


def _rule_files_cases() -> dict[str, Attack]:
    """The ways around each rule that its own test file lists (tests/webhook/test_rules_*.py, BYPASSES)."""
    found: dict[str, Attack] = {}
    for path in sorted(Path(__file__).parent.glob("test_rules_*.py")):
        module = importlib.import_module(f"{__package__}.{path.stem}")
        for name, case in getattr(module, "BYPASSES", {}).items():
            assert name not in CASES and name not in found, f"{path.name}: bypass case {name} twice"
            found[name] = case
    return found


CASES.update(_rule_files_cases())


def _judge(case: Attack) -> dict[str, Any]:
    body = admission_review(case.obj, **case.review)
    endpoint = Endpoint(case.endpoint)
    decision = decide.review(Policy(_config(case.config)), parse_review(body), endpoint)
    reply = _client(case.config).post(f"/{case.endpoint}", data=json.dumps(body), content_type="application/json")
    assert reply.status_code == 200, reply.data
    response: dict[str, Any] = reply.get_json()["response"]
    assert response["uid"] == body["request"]["uid"]
    assert response["allowed"] is decision.allowed, "the HTTP layer and decide.review disagree"
    return {"decision": decision, "response": response}


@pytest.mark.parametrize("name", list(CASES))
def test_bypass_attempt(name: str) -> None:
    case = CASES[name]
    judged = _judge(case)
    decision, response = judged["decision"], judged["response"]
    assert decision.allowed is case.allowed, f"{name}: {decision.message or decision.skipped or decision.warnings}"
    if not case.allowed:
        assert case.rule in response["status"]["message"], response["status"]["message"]
        assert case.rule in response["auditAnnotations"]["denied-by"]
    if case.patched:
        ops = json.loads(base64.b64decode(response["patch"]))
        assert any(op["path"].endswith("tolerations") or "/tolerations/" in op["path"] for op in ops), ops


def test_every_rule_has_bypass_cases() -> None:
    from gpu_stack_webhook.policy.rules import RULE_IDS  # noqa: PLC0415

    covered = {case.rule for case in CASES.values()} | {name[:6].upper() for name in CASES}
    assert set(RULE_IDS) <= covered
