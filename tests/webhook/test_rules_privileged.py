"""GPU003 no-privileged-gpu-containers: no privileged container of any kind in a GPU pod."""

from __future__ import annotations

from typing import Any

import pytest
from gpu_stack_webhook.policy.findings import Severity

from .podlib import ALL_KINDS, CONTAINER_KINDS, CONTAINER_LABEL, GPU, SPEC_PATH, container, make_pod, pod_with, wrap
from .policylib import config_default, decide, findings, only, summary

RULE = "GPU003"
PRIV = "securityContext.privileged"


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("field", CONTAINER_KINDS)
def test_privileged_container_of_every_kind_in_gpu_pod(field: str, kind: str) -> None:
    # a privileged container (main, init or ephemeral) next to a GPU container: sees every GPU -> deny
    bad = container("x", privileged=True)
    if field == "containers":
        pod = make_pod([bad, container("app", gpu=1)])
    else:
        pod = pod_with(field, bad, main=container("app", gpu=1))
    obj = wrap(pod, kind)
    f = only(findings(obj, RULE, kind))
    assert f.severity is Severity.DENY
    assert f.path == f"{SPEC_PATH[kind]}.{field}[0].{PRIV}"
    assert f.message.startswith(f'{CONTAINER_LABEL[field]} "x" is privileged in a GPU pod')
    assert "remove securityContext.privileged" in f.message


# (pod, config overrides, expected [(severity, path)])
CASES = [
    # the GPU container itself is privileged -> deny
    pytest.param(make_pod([container("x", gpu=1, privileged=True)]), {}, [("deny", "spec.containers[0]")],
                 id="privileged-gpu-container"),
    # privileged: false is fine -> allowed
    pytest.param(make_pod([container("x", gpu=1, privileged=False)]), {}, [], id="privileged-false-allowed"),
    # privileged pod without any GPU: not this rule's business -> allowed
    pytest.param(make_pod([container("x", privileged=True)]), {}, [], id="privileged-non-gpu-pod-allowed"),
    # no GPU request but runtimeClassName nvidia: the NVIDIA runtime runs it, privileged sees all GPUs -> deny
    pytest.param(make_pod([container("x", privileged=True)], runtimeClassName="nvidia"), {},
                 [("deny", "spec.containers[0]")], id="runtimeclass-nvidia-no-request"),
    # another runtime class, no GPU -> allowed
    pytest.param(make_pod([container("x", privileged=True)], runtimeClassName="kata"), {}, [],
                 id="runtimeclass-other-allowed"),
    # a configured extra GPU runtime class -> deny
    pytest.param(make_pod([container("x", privileged=True)], runtimeClassName="nvidia-cdi"),
                 {"gpuRuntimeClassNames": ["nvidia", "nvidia-cdi"]}, [("deny", "spec.containers[0]")],
                 id="runtimeclass-configured"),
    # the GPU request is only in an init container: still a GPU pod -> the privileged main container is denied
    pytest.param(make_pod([container("x", privileged=True)], init=[container("i", gpu=1)]), {},
                 [("deny", "spec.containers[0]")], id="gpu-only-in-init-container"),
    # privileged debug container added to a GPU pod (kubectl debug --profile=sysadmin) -> deny
    pytest.param(make_pod([container("app", gpu=1)], ephemeral=[container("dbg", privileged=True)]), {},
                 [("deny", "spec.ephemeralContainers[0]")], id="privileged-ephemeral-in-gpu-pod"),
    # GPU named only as a limit (request defaulted later) -> GPU pod -> deny
    pytest.param(make_pod([container("x", limits={GPU: 1}, privileged=True)]), {}, [("deny", "spec.containers[0]")],
                 id="limit-only-gpu"),
    # a shared GPU name makes it a GPU pod too -> deny
    pytest.param(make_pod([container("x", requests={"nvidia.com/gpu.shared": 1}, limits={"nvidia.com/gpu.shared": 1},
                                     privileged=True)]), {}, [("deny", "spec.containers[0]")], id="gpu.shared"),
    # a MIG slice -> GPU pod -> deny
    pytest.param(make_pod([container("x", requests={"nvidia.com/mig-1g.5gb": 1}, limits={"nvidia.com/mig-1g.5gb": 1},
                                     privileged=True)]), {}, [("deny", "spec.containers[0]")], id="mig-slice"),
    # a foreign accelerator is not a GPU by default -> allowed
    pytest.param(make_pod([container("x", limits={"example.com/gpu": 1}, privileged=True)]), {}, [],
                 id="foreign-resource-allowed"),
    # ... but is once configured as an extra GPU name -> deny
    pytest.param(make_pod([container("x", limits={"example.com/gpu": 1}, privileged=True)]),
                 {"gpuResources": {"names": ["example.com/gpu"]}}, [("deny", "spec.containers[0]")],
                 id="configured-extra-name"),
    # two privileged containers: both named in their own finding
    pytest.param(make_pod([container("a", gpu=1, privileged=True), container("b", privileged=True)]), {},
                 [("deny", "spec.containers[0]"), ("deny", "spec.containers[1]")], id="two-privileged"),
    # GPU request of 0 still names a GPU resource: treated as a GPU pod -> deny (conservative)
    pytest.param(make_pod([container("x", gpu=0, privileged=True)]), {}, [("deny", "spec.containers[0]")],
                 id="zero-gpu-request"),
]


@pytest.mark.parametrize(("pod", "config", "expected"), CASES)
def test_privileged_cases(pod: dict[str, Any], config: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    found = findings(pod, RULE, config=config_default(**config))
    assert [(f.severity.value, f.path) for f in found] == [(s, f"{p}.{PRIV}") for s, p in expected]


def test_privileged_gpu_pod_is_denied_at_validate_only() -> None:
    # Kubernetes (without Pod Security) accepts privileged pods: /mutate allows, /validate denies with the path
    pod = make_pod([container("cuda", gpu=1, privileged=True)])
    assert decide(pod, "mutate").allowed
    decision = decide(pod, "validate")
    assert not decision.allowed and decision.code == 403
    assert decision.message.startswith('GPU003 container "cuda" is privileged in a GPU pod')
    assert decision.message.endswith("(spec.containers[0].securityContext.privileged)")


def test_disabled_rule_reports_nothing() -> None:
    # GPU003 disabled: a privileged GPU pod passes
    pod = make_pod([container("x", gpu=1, privileged=True)])
    config = config_default(rules={"disabled": ["GPU003"]})
    assert findings(pod, RULE, config=config) == []
    assert decide(pod, "validate", config).allowed
    assert summary(findings(pod, RULE)) == [(RULE, "deny", "spec.containers[0].securityContext.privileged")]
