"""The webhook configurations' matchConditions as the chart renders them (cel/match_conditions.py)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from gpu_stack_dev.chartlib import FULLNAME, one, overlays, render
from gpu_stack_webhook.cel import match_conditions, runtime
from gpu_stack_webhook.cel.library import config_values
from gpu_stack_webhook.policy.config import parse_config
from gpu_stack_webhook.policy.dra import EXTENDED_RESOURCE_PREFIX
from gpu_stack_webhook.policy.sharing import SharingIndex

WEBHOOK = f"{FULLNAME}-webhook"


def _conditions(objects: list[dict[str, Any]], kind: str) -> list[dict[str, str]]:
    (hook,) = one(objects, kind, WEBHOOK)["webhooks"]
    conditions = hook["matchConditions"]
    assert isinstance(conditions, list)
    return conditions


@pytest.mark.parametrize("overlay", overlays())
def test_each_webhook_is_called_only_through_the_expression_for_its_policy(overlay: str) -> None:
    """The rendered expressions are exactly what the offline evaluator (and so the property tests) runs
    for the policy the same render gives the webhook."""
    objects = render(4, overlay).objects()
    policy = parse_config(yaml.safe_load(one(objects, "ConfigMap", f"{WEBHOOK}-policy")["data"]["policy.yaml"]))
    values = config_values(policy)
    for kind, mutating in (("MutatingWebhookConfiguration", True), ("ValidatingWebhookConfiguration", False)):
        assert _conditions(objects, kind) == [
            {"name": "judged-by-a-gpu-rule", "expression": match_conditions.expression(mutating, values)}]


@pytest.mark.parametrize(("overlay", "default_runtime"), [
    ("default", False), ("k3s.yaml", False), ("preinstalled-driver-toolkit.yaml", True)])
def test_the_runtime_layout_decides_whether_every_pod_reaches_the_nvidia_runtime(overlay: str,
                                                                                 default_runtime: bool) -> None:
    objects = render(4, overlay).objects()
    policy = yaml.safe_load(one(objects, "ConfigMap", f"{WEBHOOK}-policy")["data"]["policy.yaml"])
    assert policy["nvidiaRuntimeIsDefault"] is default_runtime


def test_toolkit_as_default_runtime_sends_what_that_runtime_reads_to_validate() -> None:
    """With nvidia as the default runtime every pod runs under it: a pod that names NVIDIA_VISIBLE_DEVICES,
    an envFrom source or the device list directory is judged, GPU or not; a plain pod still is not."""
    objects = render(4, "default", {"toolkit.setAsDefault": True}).objects()
    policy = yaml.safe_load(one(objects, "ConfigMap", f"{WEBHOOK}-policy")["data"]["policy.yaml"])
    assert policy["nvidiaRuntimeIsDefault"] is True
    (condition,) = _conditions(objects, "ValidatingWebhookConfiguration")

    def pod(**container: Any) -> dict[str, Any]:
        return {"kind": "Pod", "metadata": {}, "spec": {"containers": [{"name": "c", "image": "x", **container}]}}

    def called(obj: dict[str, Any]) -> bool:
        return bool(runtime.evaluate(condition["expression"], obj, {}))

    assert not called(pod())
    assert called(pod(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]))
    assert called(pod(envFrom=[{"configMapRef": {"name": "settings"}}]))
    assert called(pod(volumeMounts=[{"name": "v", "mountPath": "/var/run/nvidia-container-devices/all"}]))
    assert not called(pod(env=[{"name": "LOG_LEVEL", "value": "debug"}]))


def test_disabled_rules_reach_the_conditions() -> None:
    objects = render(4, "default", {"webhook.policy.rules.disabled": ["GPU002", "GPU007"]}).objects()
    (condition,) = _conditions(objects, "ValidatingWebhookConfiguration")
    assert '!(id in ["GPU002","GPU007"])' in condition["expression"]


def test_no_config_placeholder_is_left_unfilled() -> None:
    for overlay in overlays():
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            (condition,) = _conditions(render(4, overlay).objects(), kind)
            assert "${" not in condition["expression"], (overlay, kind)


def test_declared_non_gpu_runtime_classes_are_left_out_and_kept_non_nvidia_by_a_policy() -> None:
    objects = render(4, "default", {"webhook.policy.nonGpuRuntimeClassNames": ["kata", "gvisor"]}).objects()
    (condition,) = _conditions(objects, "ValidatingWebhookConfiguration")

    def called(runtime_class: str, **container: Any) -> bool:
        pod = {"kind": "Pod", "metadata": {}, "spec": {
            "runtimeClassName": runtime_class, "containers": [{"name": "c", "image": "x", **container}]}}
        return bool(runtime.evaluate(condition["expression"], pod, {}))

    assert not called("gvisor") and not called("kata")
    assert called("sandboxed") and called("nvidia")
    assert called("gvisor", resources={"limits": {"nvidia.com/gpu": "1"}})

    policy = one(objects, "ValidatingAdmissionPolicy", f"{FULLNAME}-non-gpu-runtime-classes")["spec"]
    assert policy["matchConstraints"]["resourceRules"] == [{
        "apiGroups": ["node.k8s.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
        "resources": ["runtimeclasses"]}]
    assert policy["failurePolicy"] == "Fail"
    (match,) = policy["matchConditions"]
    (validation,) = policy["validations"]
    handlers = ["nvidia", "nvidia-cdi", "nvidia-legacy", "nvidia-experimental"]

    def refused(name: str, handler: str) -> bool:
        obj = {"metadata": {"name": name}, "handler": handler}
        return bool(runtime.evaluate(match["expression"], obj, {})) and not runtime.evaluate(
            validation["expression"], obj, {})

    assert [h for h in handlers if refused("gvisor", h)] == handlers
    assert not refused("gvisor", "runsc") and not refused("kata", "kata") and not refused("gpu-fast", "nvidia")
    binding = one(objects, "ValidatingAdmissionPolicyBinding", f"{FULLNAME}-non-gpu-runtime-classes")["spec"]
    assert binding == {"policyName": f"{FULLNAME}-non-gpu-runtime-classes", "validationActions": ["Deny"]}
    assert not [o for o in render(4, "default").objects() if "non-gpu-runtime" in o["metadata"]["name"]]


@pytest.mark.parametrize(("names", "prefixes", "sent", "skipped"), [
    # The chart's defaults: a dot is a dot, a name is whole, a prefix is a prefix.
    (None, None, ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb"],
     ["nvidia.com/gpuXshared", "nvidia.com/gpu2", "example.com/nvidia.com/gpu", "nvidia.com/mig", "cpu"]),
    # What a regular expression would read otherwise is read as itself.
    (["vendor.io/a+b(c)"], ["vendor.io/x[1]."], ["vendor.io/a+b(c)", "vendor.io/x[1].y"],
     ["vendor.io/aab(c)", "vendor.io/a+bc", "vendor.io/x1y"]),
    # No GPU names at all: only DRA's extended resources send a pod.
    ([], [], ["deviceclass.resource.kubernetes.io/gpu.nvidia.com"], ["nvidia.com/gpu", "cpu"]),
])
def test_the_conditions_read_gpu_resource_names_as_the_webhook_does(names: list[str] | None,
                                                                    prefixes: list[str] | None,
                                                                    sent: list[str], skipped: list[str]) -> None:
    """The config's GPU names and prefixes reach the conditions as one regular expression (gpuResourcePattern,
    built by the chart): a container asking for a resource the webhook counts as a GPU is sent, any other is not."""
    settings: dict[str, Any] = {}
    if names is not None:
        settings["webhook.policy.gpuResources"] = {"names": names, "prefixes": prefixes}
    objects = render(4, "default", settings).objects()
    policy = parse_config(yaml.safe_load(one(objects, "ConfigMap", f"{WEBHOOK}-policy")["data"]["policy.yaml"]))
    index = SharingIndex(policy)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (condition,) = _conditions(objects, kind)
        for resource in sent + skipped:
            pod = {"kind": "Pod", "metadata": {}, "spec": {"containers": [
                {"name": "c", "image": "x", "resources": {"limits": {resource: "1"}}}]}}
            called = runtime.evaluate(condition["expression"], pod, {})
            assert called is (resource in sent), (kind, resource)
            assert called is (index.is_gpu(resource) or resource.startswith(EXTENDED_RESOURCE_PREFIX)), resource
