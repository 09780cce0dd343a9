"""GPU001 gpu-limits-equal-requests: whole-number GPU limits equal to requests; a missing limit is filled
on Pod CREATE (/mutate) and denied everywhere else."""

from __future__ import annotations

from typing import Any

import pytest
from gpu_stack_webhook.policy.findings import Severity

from .podlib import (
    ALL_KINDS,
    CONTAINER_KINDS,
    CONTAINER_LABEL,
    GPU,
    SPEC_PATH,
    apply_patch,
    container,
    make_pod,
    pod_with,
    wrap,
)
from .policylib import config_default, decide, findings, only, rule_patch, summary

RULE = "GPU001"
REQ = f"resources.requests[{GPU}]"
LIM = f"resources.limits[{GPU}]"


def gpu_container(name: str = "x", request: Any = None, limit: Any = None, resource: str = GPU) -> dict[str, Any]:
    return container(
        name,
        requests={resource: request} if request is not None else None,
        limits={resource: limit} if limit is not None else None,
    )


# (request, limit, expected [(severity, path suffix)] at /validate, words the message must contain)
QUANTITIES = [
    # int vs string spellings of the same whole number: allowed, nothing to say
    pytest.param(1, 1, [], (), id="int-1-int-1-allowed"),
    pytest.param("1", "1", [], (), id="str-1-str-1-allowed"),
    pytest.param("1", 1, [], (), id="str-1-int-1-allowed"),
    # "1000m" is the quantity 1: equal to a limit of 1, allowed
    pytest.param("1000m", 1, [], (), id="1000m-equals-1-allowed"),
    pytest.param(1, "1000m", [], (), id="1-equals-limit-1000m-allowed"),
    # "2k" is 2000 whole GPUs: equal to "2000", allowed by GPU001 (sharing rules judge the count)
    pytest.param("2k", "2000", [], (), id="2k-equals-2000-allowed"),
    # binary suffix 1Ki == 1024
    pytest.param("1Ki", 1024, [], (), id="1Ki-equals-1024-allowed"),
    # zero GPUs on both sides is a consistent (if odd) request
    pytest.param(0, 0, [], (), id="zero-zero-allowed"),
    # limit only: Kubernetes defaults the request from the limit, nothing to fix
    pytest.param(None, 1, [], (), id="limit-only-allowed"),
    # a fraction of a GPU: "1.5" is denied at the request, naming the raw value
    pytest.param("1.5", "1.5", [("deny", REQ)], ("1.5", "not a whole number", "time-slicing"), id="1.5-denied"),
    # "500m" is half a GPU: denied
    pytest.param("500m", "500m", [("deny", REQ)], ("500m", "not a whole number"), id="500m-denied"),
    # fractional request without a limit: the fraction is what is reported (not the missing limit)
    pytest.param("0.5", None, [("deny", REQ)], ("0.5", "not a whole number"), id="fraction-request-no-limit-denied"),
    # whole request but fractional limit: denied at the limit
    pytest.param(1, "1.5", [("deny", LIM)], ("limit 1.5", "not a whole number"), id="fraction-limit-denied"),
    # request 1 limit 2: Kubernetes rejects extended-resource overcommit; we deny first, naming both values
    pytest.param(1, 2, [("deny", REQ)], ("request 1 != limit 2",), id="mismatch-1-2-denied"),
    # "1000m" request vs limit 2: values are normalised in the message
    pytest.param("1000m", 2, [("deny", REQ)], ("request 1 != limit 2",), id="mismatch-1000m-2-denied"),
    # negative quantity: denied
    pytest.param("-1", "-1", [("deny", REQ)], ("-1",), id="negative-denied"),
    # not a quantity at all: denied rather than ignored
    pytest.param("abc", "abc", [("deny", REQ)], ("abc",), id="garbage-denied"),
    # a JSON boolean is not a quantity: denied rather than read as 1
    pytest.param(True, True, [("deny", REQ)], ("True",), id="boolean-denied"),
    # a Unicode digit ("²" passes str.isdigit) is not a quantity: denied like "abc", not a rule crash
    pytest.param("²", "²", [("deny", REQ)], ("²",), id="unicode-digit-denied"),
    # request without limit at /validate (workload template or a Pod that skipped /mutate): denied at limits
    pytest.param(1, None, [("deny", LIM)], ("request 1 but no limit", "limits.nvidia.com/gpu to 1"),
                 id="request-only-denied-at-validate"),
]


@pytest.mark.parametrize(("request_", "limit", "expected", "words"), QUANTITIES)
def test_quantity_spellings(request_: Any, limit: Any, expected: list[tuple[str, str]], words: tuple[str, ...]) -> None:
    found = findings(make_pod([gpu_container("x", request_, limit)]), RULE)
    assert [(f.severity.value, f.path) for f in found] == [(s, f"spec.containers[0].{p}") for s, p in expected]
    for f in found:
        assert f.message.startswith('container "x": ')
        assert f.deny_early, "Kubernetes rejects these itself; /mutate must already deny them"
        for word in words:
            assert word in f.message


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("field", CONTAINER_KINDS)
def test_mismatch_in_every_container_kind_and_workload(field: str, kind: str) -> None:
    # request 1 / limit 2 in any container of any workload's pod template: denied at that container's path
    obj = wrap(pod_with(field, gpu_container("x", 1, 2)), kind)
    f = only(findings(obj, RULE, kind))
    assert f.severity is Severity.DENY
    assert f.path == f"{SPEC_PATH[kind]}.{field}[0].{REQ}"
    assert f.message.startswith(f'{CONTAINER_LABEL[field]} "x": nvidia.com/gpu request 1 != limit 2')
    # the user sees the rule ID, the message and the path in one line
    assert f.text == f"GPU001 {f.message} ({f.path})"


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("field", CONTAINER_KINDS)
def test_request_only_is_denied_when_it_cannot_be_patched(field: str, kind: str) -> None:
    # request without limit judged at /validate (or any workload): nothing can fill it, so denied
    obj = wrap(pod_with(field, gpu_container("x", 1, None)), kind)
    f = only(findings(obj, RULE, kind))
    assert (f.severity, f.path) == (Severity.DENY, f"{SPEC_PATH[kind]}.{field}[0].{LIM}")
    assert CONTAINER_LABEL[field] in f.message


@pytest.mark.parametrize("kind", [k for k in ALL_KINDS if k != "Pod"])
def test_workload_template_is_never_patched(kind: str) -> None:
    # /mutate only patches Pods: a Deployment template with request-only is denied (early), not patched
    obj = wrap(make_pod([gpu_container("x", 1, None)]), kind)
    decision = decide(obj, "mutate", kind=kind)
    assert not decision.allowed and decision.code == 403
    assert decision.patch == ()
    assert "GPU001" in decision.message and f"{SPEC_PATH[kind]}.containers[0].{LIM}" in decision.message


# (resources of the container, ops (relative to the container pointer) with the effect of the patch)
FILL_CASES = [
    # requests only, no limits map: add the whole limits map
    pytest.param({"requests": {GPU: 1}}, [("/resources/limits", {GPU: 1})], id="no-limits-map"),
    # a limits map exists (cpu only): add just the GPU key, pointer-escaped (nvidia.com~1gpu)
    pytest.param({"requests": {GPU: "1", "cpu": "1"}, "limits": {"cpu": "1"}},
                 [("/resources/limits/nvidia.com~1gpu", "1")], id="limits-map-without-gpu"),
    # an empty limits map: add the key into it
    pytest.param({"requests": {GPU: 2}, "limits": {}}, [("/resources/limits/nvidia.com~1gpu", 2)],
                 id="empty-limits-map"),
    # limits: null (as some clients send): replaced by a map
    pytest.param({"requests": {GPU: 1}, "limits": None}, [("/resources/limits", {GPU: 1})], id="null-limits"),
    # odd spelling "1000m" is copied as written, so request == limit exactly
    pytest.param({"requests": {GPU: "1000m"}}, [("/resources/limits", {GPU: "1000m"})], id="1000m-copied"),
    # two GPU resources without limits in one container: one finding, both filled
    pytest.param({"requests": {GPU: 1, "nvidia.com/mig-1g.5gb": 1}},
                 [("/resources/limits", {GPU: 1, "nvidia.com/mig-1g.5gb": 1})], id="two-resources-one-op"),
    pytest.param({"requests": {GPU: 1, "nvidia.com/mig-1g.5gb": 1}, "limits": {}},
                 [("/resources/limits/nvidia.com~1gpu", 1), ("/resources/limits/nvidia.com~1mig-1g.5gb", 1)],
                 id="two-resources-two-ops"),
]


@pytest.mark.parametrize("field", CONTAINER_KINDS)
@pytest.mark.parametrize(("resources", "ops"), FILL_CASES)
def test_missing_limit_is_filled_on_pod_create(field: str, resources: dict[str, Any],
                                               ops: list[tuple[str, Any]]) -> None:
    # Pod CREATE at /mutate with a request but no limit: a warning that carries the patch; applying it
    # gives a pod GPU001 has nothing more to say about (idempotent)
    pod = pod_with(field, {"name": "x", "image": "cuda", "resources": resources})
    f = only(findings(pod, RULE, can_patch=True))
    assert f.severity is Severity.WARN
    assert f.path == f"spec.{field}[0].resources.limits"
    assert f.message.startswith(f'{CONTAINER_LABEL[field]} "x": set GPU limit ')
    assert f.changed
    base = f"/spec/{field}/0"
    patched = apply_patch(pod, rule_patch(pod, RULE))
    assert patched == apply_patch(pod, [{"op": "add", "path": base + p, "value": v} for p, v in ops])
    assert findings(patched, RULE, can_patch=True) == [] and rule_patch(patched, RULE) == []
    assert findings(patched, RULE) == []


def test_gpu_request_only_in_init_container() -> None:
    # the only GPU request sits in an init container without a limit: /mutate fills it there, /validate denies
    pod = make_pod([container("app")], init=[gpu_container("warmup", 1, None)])
    decision = decide(pod, "mutate")
    assert decision.allowed
    assert list(decision.patch) == [
        {"op": "add", "path": "/spec/initContainers/0/resources/limits", "value": {GPU: 1}}
    ]
    assert decision.warnings == ('gpu-stack GPU001: initContainer "warmup": set GPU limit nvidia.com/gpu=1 '
                                 "from its request",)
    denied = decide(pod, "validate")
    assert not denied.allowed
    assert "spec.initContainers[0].resources.limits[nvidia.com/gpu]" in denied.message


@pytest.mark.parametrize(
    ("resource", "config", "denied"),
    [
        # nvidia.com/gpu.shared (a renamed time-sliced GPU) is a GPU resource: half of one is denied
        pytest.param("nvidia.com/gpu.shared", {}, True, id="gpu.shared-fraction-denied"),
        # a MIG slice name is a GPU resource too
        pytest.param("nvidia.com/mig-1g.5gb", {}, True, id="mig-fraction-denied"),
        # not every nvidia.com/ name is a GPU: NVIDIA Network Operator RDMA resources are not
        pytest.param("nvidia.com/whatever", {}, False, id="other-nvidia-name-not-a-gpu"),
        pytest.param("nvidia.com/rdma_shared_device_a", {}, False, id="network-operator-rdma-not-a-gpu"),
        pytest.param("nvidia.com/hostdev", {}, False, id="network-operator-hostdev-not-a-gpu"),
        # the old default, any nvidia.com/ name, by configuration
        pytest.param("nvidia.com/whatever", {"gpuResources": {"prefixes": ["nvidia.com/"]}}, True,
                     id="any-nvidia-prefix-by-config"),
        # the shared name nvidia.com/gpu.shared is a GPU even where no config renames
        pytest.param("nvidia.com/gpu.shared", {}, True, id="gpu-shared-denied"),
        # a vendor name outside the prefixes is not ours to judge by default
        pytest.param("example.com/gpu", {}, False, id="foreign-resource-ignored"),
        # ... unless it is configured as an extra GPU name
        pytest.param("example.com/gpu", {"gpuResources": {"names": ["example.com/gpu"]}}, True,
                     id="configured-extra-name-denied"),
        # ... or under a configured extra prefix
        pytest.param("example.com/gpu", {"gpuResources": {"prefixes": ["nvidia.com/", "example.com/"]}}, True,
                     id="configured-extra-prefix-denied"),
        # cpu fractions are perfectly normal
        pytest.param("cpu", {}, False, id="cpu-fraction-ignored"),
    ],
)
def test_which_resources_are_gpus(resource: str, config: dict[str, Any], denied: bool) -> None:
    # a fractional amount of `resource`: denied only when it counts as a GPU
    pod = make_pod([gpu_container("x", "500m", "500m", resource=resource)])
    found = findings(pod, RULE, config=config_default(**config))
    assert summary(found) == ([(RULE, "deny", f"spec.containers[0].resources.requests[{resource}]")] if denied else [])


def test_every_container_is_reported_in_one_denial() -> None:
    # two containers with two different problems: /mutate denies early and lists both
    pod = make_pod([gpu_container("a", 1, 2), gpu_container("b", "1.5", "1.5")])
    decision = decide(pod, "mutate")
    assert not decision.allowed and decision.code == 403
    assert decision.message.startswith("2 GPU policy violations: [1] GPU001 container \"a\"")
    assert "[2] GPU001 container \"b\": nvidia.com/gpu request 1.5 is not a whole number" in decision.message


def test_disabled_rule_reports_nothing() -> None:
    # GPU001 disabled by config: a mismatch passes both endpoints (Kubernetes still rejects it itself)
    pod = make_pod([gpu_container("x", 1, 2)])
    config = config_default(rules={"disabled": ["GPU001"]})
    assert findings(pod, RULE, config=config) == []
    assert decide(pod, "mutate", config).allowed
    assert decide(pod, "validate", config).allowed

