"""Runtime layout per preset: the toolkit, the device plugin and the webhook agree, and no
preset lets an environment variable pick GPUs.

Upstream facts relied on:
- nvidia-container-toolkit v1.20.0 cmd/nvidia-ctk-installer/toolkit/toolkit.go: the installer's
  accept-nvidia-visible-devices-envvar-when-unprivileged defaults to true (so the chart must set
  ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED=false) and reads
  ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS for the volume-mounts strategy.
- nvidia-container-toolkit v1.20.0 internal/config/image/cuda_image.go: VisibleDevices reads volume-mount
  requests first when accepted, and the environment only when privileged or accepted unprivileged.
- nvidia-container-toolkit v1.20.0 cmd/nvidia-ctk-installer/container/runtime/runtime.go: RUNTIME_ENABLE_CDI
  (enable-cdi-in-runtime) defaults to the toolkit's CDI_ENABLED, so toolkit.cdi.enabled also turns on CDI in
  containerd / CRI-O (the cdi layout needs nothing else from the chart).
- k8s-device-plugin v0.20.0 api/config/v1/consts.go: strategies envvar, volume-mounts, cdi-annotations, cdi-cri.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from gpu_stack_dev.chartlib import find, overlays, render, run_helm, template_args


def _env(objects: list[dict[str, Any]], component: str, container: str) -> dict[str, str]:
    for ds in find(objects, "DaemonSet"):
        if ds["metadata"]["name"].endswith(component):
            for c in ds["spec"]["template"]["spec"]["containers"]:
                if c["name"] == container:
                    return {e["name"]: e.get("value") for e in c.get("env", [])}
    return {}


def _policy(objects: list[dict[str, Any]]) -> dict[str, Any]:
    for cm in find(objects, "ConfigMap"):
        if "policy.yaml" in cm.get("data", {}):
            return yaml.safe_load(cm["data"]["policy.yaml"])  # type: ignore[no-any-return]
    raise AssertionError("no webhook policy ConfigMap")


@pytest.mark.parametrize("overlay", overlays())
def test_each_preset_agrees_and_no_env_var_selects_gpus(overlay: str) -> None:
    objects = render(overlay=overlay).objects()
    policy = _policy(objects)
    strategies = {tuple(cfg["flags"]["plugin"]["deviceListStrategy"]) for cfg in policy["sharing"]["configs"].values()}
    assert len(strategies) == 1
    (strategy,) = strategies
    assert "envvar" not in strategy, f"{overlay}: envvar lets NVIDIA_VISIBLE_DEVICES pick GPUs"
    toolkit = _env(objects, "container-toolkit", "nvidia-container-toolkit")
    if not toolkit:  # preinstalled toolkit: nothing to inject, the node's runtime is the default
        # (policy only: the webhook replaces this with what the GPU Operator or device plugin runs with)
        assert overlay == "preinstalled-driver-toolkit.yaml" or overlay.startswith("policy-only-")
        assert policy["injectRuntimeClassName"] == ""
        assert strategy == ("volume-mounts",)
        return
    assert toolkit["ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED"] == "false"
    assert toolkit["NVIDIA_RUNTIME_SET_AS_DEFAULT"] == "false", f"{overlay}: nvidia must not be the default runtime"
    if "volume-mounts" in strategy:
        assert toolkit["ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS"] == "true"
        # GPU pods need the NVIDIA runtime: the mutating webhook gives it to them
        assert policy["injectRuntimeClassName"] == toolkit["NVIDIA_RUNTIME_NAME"] == "nvidia"
        assert find(objects, "RuntimeClass", "nvidia")[0]["handler"] == "nvidia"


def test_cdi_layout_needs_no_runtime_class() -> None:
    objects = render(set_json={"devicePlugin.deviceListStrategy": ["cdi-cri"], "toolkit.cdi.enabled": True}).objects()
    assert _env(objects, "container-toolkit", "nvidia-container-toolkit")["CDI_ENABLED"] == "true"
    assert _policy(objects)["injectRuntimeClassName"] == ""


def test_default_runtime_layout_injects_nothing() -> None:
    objects = render(set_json={"toolkit.setAsDefault": True}).objects()
    assert _env(objects, "container-toolkit", "nvidia-container-toolkit")["NVIDIA_RUNTIME_SET_AS_DEFAULT"] == "true"
    assert _policy(objects)["injectRuntimeClassName"] == ""


def test_namespace_opt_out_is_off_by_default() -> None:
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (config,) = find(render().objects(), kind)
        keys = [e["key"] for e in config["webhooks"][0]["namespaceSelector"]["matchExpressions"]]
        assert keys == ["kubernetes.io/metadata.name"], keys
    (config,) = find(render(set_json={"webhook.namespaceOptOutLabel": "gpu-stack.io/webhook"}).objects(),
                     "ValidatingWebhookConfiguration")
    assert config["webhooks"][0]["namespaceSelector"]["matchExpressions"][1] == {
        "key": "gpu-stack.io/webhook", "operator": "NotIn", "values": ["disabled"]}


def test_bare_sharing_names_render_and_reach_the_webhook_as_written() -> None:
    # the device plugin prefixes them itself; the webhook normalises the same way (sharing.py)
    objects = render(set_json={"sharing.configs": {"default": {"mps": {"resources": [
        {"name": "gpu", "replicas": 10}]}}}}).objects()
    assert _policy(objects)["sharing"]["configs"]["default"]["sharing"]["mps"]["resources"][0]["name"] == "gpu"


def _notes(*extra: str) -> str:
    result = run_helm(4, ["install", "--dry-run=client", *template_args(api_versions=())[1:], *extra])
    assert result.ok, result.stderr
    return result.stdout.split("NOTES:", 1)[1]


def test_notes_name_the_layout_and_warn_about_the_default_runtime() -> None:
    assert "Runtime layout: runtime-class (GPU pods get runtimeClassName nvidia from the webhook)" in _notes()
    notes = _notes("--set", "toolkit.setAsDefault=true")
    assert "Runtime layout: default-runtime\nWARNING: nvidia is the default runtime on GPU nodes" in notes


def test_the_helm_test_cuda_pod_names_the_runtime_class_itself() -> None:
    # it may run in the (exempt) release namespace, where the webhook would not add it
    pods = [p for p in find(render(namespace="default").objects(), "Pod")
            if p["metadata"]["name"].endswith("test-cuda")]
    assert pods and pods[0]["spec"]["runtimeClassName"] == "nvidia"
    pods = [p for p in find(render(overlay="preinstalled-driver-toolkit.yaml").objects(), "Pod")
            if p["metadata"]["name"].endswith("test-cuda")]
    assert pods and "runtimeClassName" not in pods[0]["spec"]
