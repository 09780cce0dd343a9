"""An API server that stops answering the webhook's reads (kube/live.py LastGood): the last good read of the
ClusterPolicy, the device plugin ConfigMap and the RuntimeClasses is used for `keep` seconds, and the policy
fails closed only after it; and bad input (a ClusterPolicy field of the wrong type, an unknown toolkit.env value,
a RuntimeClass without a handler) is logged and fails closed only for pods that could reach a GPU.

The API server here is tests/webhook/kube_fake.py (`unreachable`: every call fails as a refused connection;
`fail_next`: a Forbidden answer, the RBAC revoked); tests/e2e/test_policy_source_outage.py revokes the RBAC on
the real API server.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
from gpu_stack_webhook.admission import decide
from gpu_stack_webhook.admission.decide import Decision, Endpoint
from gpu_stack_webhook.admission.requests import admission_review
from gpu_stack_webhook.admission.review import parse_review
from gpu_stack_webhook.kube.client import Forbidden
from gpu_stack_webhook.kube.live import LastGood, OperatorReader, RuntimeClassReader
from gpu_stack_webhook.policy.config import ConfigError, PolicyConfig, parse_config
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.server.live_policy import LivePolicy

from .kube_fake import FakeKube
from .podlib import container, make_pod
from .test_live_source import cluster_policy

KEEP = 10.0
VISIBLE = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
SANDBOXED = make_pod([container("main", env=[VISIBLE])], runtimeClassName="sandboxed")
GPU_CLASS = make_pod([container("main", gpu=1)], runtimeClassName="gpu-fast")
GPU_POD = make_pod([container("main", gpu=1)])
PLAIN = make_pod([container("main")])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def judge(config: PolicyConfig, pod: dict[str, Any]) -> Decision:
    return decide.review(Policy(config), parse_review(admission_review(pod)), Endpoint.VALIDATE)


def denied_by(config: PolicyConfig, pod: dict[str, Any]) -> set[str]:
    return set(judge(config, pod).denied_by)


def operator_cluster() -> tuple[FakeKube, RuntimeClassReader, Clock]:
    fake = FakeKube()
    fake.cluster_policies["cluster-policy"] = copy.deepcopy(cluster_policy())
    fake.runtime_classes = {"nvidia": "nvidia", "gpu-fast": "nvidia", "sandboxed": "runsc"}
    clock = Clock()
    inner = OperatorReader(fake, "cluster-policy", "gpu-operator",
                           kept=LastGood("gpu-operator", KEEP, clock=clock, wall=clock))
    return fake, RuntimeClassReader(fake, inner, kept=LastGood("runtime-classes", KEEP, clock=clock, wall=clock)), clock


def test_a_failed_read_keeps_the_last_good_read_for_keep_seconds_then_fails_closed(
        caplog: pytest.LogCaptureFixture) -> None:
    fake, read, clock = operator_cluster()
    good = read(PolicyConfig())
    assert not good.source_error and not good.runtime_classes.error  # type: ignore[union-attr]
    assert judge(good, SANDBOXED).allowed and judge(good, GPU_POD).allowed
    assert read.last_reads() == {"gpu-operator": 1000.0, "runtime-classes": 1000.0}

    fake.unreachable = True  # the API server stops answering
    clock.now += KEEP
    with caplog.at_level(logging.WARNING, logger="gpu_stack_webhook.kube.live"):
        kept = read(PolicyConfig())
    assert kept == good  # judged as before: the cluster's sandboxed pods and GPU pods run
    assert judge(kept, SANDBOXED).allowed and judge(kept, GPU_POD).allowed
    assert denied_by(kept, make_pod([container("main")], runtimeClassName="gpu-fast")) == {"GPU011"}
    assert read.last_reads() == {"gpu-operator": 1000.0, "runtime-classes": 1000.0}  # stale, and it shows
    logged = [r for r in caplog.records if getattr(r, "event", "") == "policy-source-read-kept"]
    assert {getattr(r, "source", "") for r in logged} == {"gpu-operator", "runtime-classes"}
    assert "connection refused" in getattr(logged[0], "error", "")

    clock.now += 1  # past keep: fail closed, for pods that could reach a GPU only
    stale = read(PolicyConfig())
    assert "cannot list runtimeclasses.node.k8s.io" in stale.runtime_classes.error  # type: ignore[union-attr]
    assert "s old, is kept 10s" in stale.source_error
    assert "GPU010" in denied_by(stale, SANDBOXED) and denied_by(stale, GPU_POD) == {"GPU010"}
    assert "RuntimeClasses cannot be read" in judge(stale, SANDBOXED).message
    assert judge(stale, PLAIN).allowed

    fake.unreachable = False  # answered again: back to the good read, timestamps move on
    clock.now += 100
    assert read(PolicyConfig()) == good
    assert read.last_reads() == {"gpu-operator": 1111.0, "runtime-classes": 1111.0}


def test_revoked_rbac_is_a_failed_read_too() -> None:
    fake, read, clock = operator_cluster()
    good = read(PolicyConfig())
    fake.fail_next["list_runtime_classes"] = [Forbidden(403, "Forbidden", "runtimeclasses is forbidden")] * 2
    clock.now += 5
    assert read(PolicyConfig()) == good
    clock.now += KEEP
    stale = read(PolicyConfig())
    assert "no permission to list runtimeclasses.node.k8s.io" in stale.runtime_classes.error  # type: ignore[union-attr]
    assert not stale.source_error  # the ClusterPolicy was answered
    assert read.last_reads()["gpu-operator"] == clock.now


def test_an_answer_the_policy_refuses_fails_closed_at_once() -> None:
    """Keeping the last read is for an API server that does not answer; a ClusterPolicy deleted or changed into
    something refused is an answer."""
    fake, read, clock = operator_cluster()
    read(PolicyConfig())
    del fake.cluster_policies["cluster-policy"]
    clock.now += 1
    gone = read(PolicyConfig())
    assert "ClusterPolicy cluster-policy does not exist" in gone.source_error
    assert denied_by(gone, GPU_POD) == {"GPU010"} and judge(gone, PLAIN).allowed


def test_the_first_read_has_nothing_to_keep() -> None:
    fake, read, _ = operator_cluster()
    fake.unreachable = True
    config = read(PolicyConfig())
    assert "cannot get clusterpolicies.nvidia.com cluster-policy" in config.source_error
    assert "GPU010" in denied_by(config, SANDBOXED) and judge(config, PLAIN).allowed
    assert read.last_reads() == {"gpu-operator": 0.0, "runtime-classes": 0.0}


def test_live_policy_publishes_when_each_source_was_last_read() -> None:
    fake, read, clock = operator_cluster()
    published: list[dict[str, float]] = []
    live = LivePolicy(None, PolicyConfig(), read, interval=3600, publish=published.append)
    live()  # the first request of the process publishes
    assert published == [{"gpu-operator": 1000.0, "runtime-classes": 1000.0}]
    fake.unreachable = True
    clock.now += 2 * KEEP
    assert live.refresh() and live.current.config.source_error


# --- bad input ------------------------------------------------------------------------------------------


def live_policy_log(obj: dict[str, Any], caplog: pytest.LogCaptureFixture) -> tuple[PolicyConfig, str]:
    fake = FakeKube()
    fake.cluster_policies["cluster-policy"] = obj
    with caplog.at_level(logging.ERROR, logger="gpu_stack_webhook.server.live_policy"):
        live = LivePolicy(None, PolicyConfig(), OperatorReader(fake, "cluster-policy", "gpu-operator"),
                          describe="GPU Operator ClusterPolicy cluster-policy")
    errors = [r for r in caplog.records if getattr(r, "event", "") == "policy-source-unavailable"]
    assert len(errors) == 1
    return live.current.config, f"{errors[0].getMessage()}: {getattr(errors[0], 'error', '')}"


@pytest.mark.parametrize(("edit", "message"), [
    (lambda spec: spec["cdi"].update({"nriPluginEnabled": "yes"}), "spec.cdi.nriPluginEnabled is not a boolean: 'yes'"),
    (lambda spec: spec["toolkit"].update({"env": {"ENABLE_NRI_PLUGIN": "true"}}), "spec.toolkit.env is not a list"),
    (lambda spec: spec["operator"].update({"runtimeClass": 7}), "spec.operator.runtimeClass is not a string: 7"),
    (lambda spec: spec["toolkit"].update({"env": [{"name": "ENABLE_NRI_PLUGIN", "value": "sometimes"}]}),
     "spec.toolkit.env ENABLE_NRI_PLUGIN='sometimes' is not a boolean the toolkit reads"),
])
def test_a_bad_cluster_policy_is_logged_and_denies_only_what_could_reach_a_gpu(
        edit: Any, message: str, caplog: pytest.LogCaptureFixture) -> None:
    obj = copy.deepcopy(cluster_policy())
    edit(obj["spec"])
    config, logged = live_policy_log(obj, caplog)
    assert logged.startswith("GPU pods are denied: GPU Operator ClusterPolicy cluster-policy cannot be read: ")
    assert message in logged
    assert denied_by(config, GPU_POD) == {"GPU010"} and message in judge(config, GPU_POD).message
    assert judge(config, PLAIN).allowed


def test_a_runtime_class_without_a_handler_is_logged_and_only_its_pods_denied(
        caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeKube()
    fake.runtime_classes = {"broken": "", "sandboxed": "runsc"}
    read = RuntimeClassReader(fake)
    with caplog.at_level(logging.ERROR, logger="gpu_stack_webhook.kube.live"):
        config = read(PolicyConfig(nvidiaRuntimeIsDefault=False))
        read(PolicyConfig(nvidiaRuntimeIsDefault=False))  # logged once, not on every read
    logged = [r for r in caplog.records if getattr(r, "event", "") == "runtime-class-without-handler"]
    assert len(logged) == 1 and getattr(logged[0], "runtimeClasses", None) == ["broken"]
    broken = make_pod([container("main")], runtimeClassName="broken")
    assert denied_by(config, broken) == {"GPU010"}
    assert "RuntimeClass broken has no handler" in judge(config, broken).message
    assert judge(config, SANDBOXED).allowed and judge(config, PLAIN).allowed


def test_a_runtime_class_declared_non_gpu_is_not_a_gpu_runtime_class_even_when_the_read_fails() -> None:
    fake = FakeKube()
    fake.runtime_classes = {"gpu-fast": "nvidia", "sandboxed": "runsc"}
    clock = Clock()
    read = RuntimeClassReader(fake, kept=LastGood("runtime-classes", KEEP, clock=clock, wall=clock))
    declared = PolicyConfig(nvidiaRuntimeIsDefault=False, nonGpuRuntimeClassNames=["sandboxed", "kata"])
    config = read(declared)
    kata = make_pod([container("main", env=[VISIBLE])], runtimeClassName="kata")  # not (yet) read: no lookup
    assert judge(config, SANDBOXED).allowed and judge(config, kata).allowed
    fake.unreachable = True
    clock.now += KEEP + 1
    config = read(declared)
    assert judge(config, SANDBOXED).allowed and judge(config, kata).allowed
    assert denied_by(config, GPU_CLASS) == {"GPU010"}  # the others still fail closed


def test_a_runtime_class_declared_non_gpu_with_an_nvidia_handler_is_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeKube()
    fake.runtime_classes = {"gvisor": "nvidia", "kata": "kata"}
    read = RuntimeClassReader(fake)
    declared = PolicyConfig(nvidiaRuntimeIsDefault=False, nonGpuRuntimeClassNames=["gvisor", "kata"])
    with caplog.at_level(logging.ERROR, logger="gpu_stack_webhook.kube.live"):
        read(declared)
        read(declared)
    logged = [r for r in caplog.records if getattr(r, "event", "") == "runtime-class-declared-non-gpu-is-nvidia"]
    assert len(logged) == 1 and getattr(logged[0], "runtimeClasses", None) == ["gvisor"]


@pytest.mark.parametrize("document", [
    {"gpuRuntimeClassNames": ["nvidia", "gpu-fast"], "nonGpuRuntimeClassNames": ["gpu-fast"]},
    {"injectRuntimeClassName": "nvidia", "nonGpuRuntimeClassNames": ["nvidia"]},
])
def test_a_runtime_class_cannot_be_declared_both_gpu_and_non_gpu(document: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="cannot be in nonGpuRuntimeClassNames"):
        parse_config(document)
