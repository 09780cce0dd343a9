"""Policy only (docs/gpu-operator.md): Chart-values-examples/policy-only-*.yaml install the webhook, inspect's
RBAC, the dashboards and the alerts, no node agent, and give the webhook what it needs to follow the
GPU Operator's ClusterPolicy or the device-plugin chart's ConfigMap live."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from gpu_stack_dev.chartlib import find, one, render
from gpu_stack_webhook.policy.config import parse_config
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.policy.live import device_plugin_policy

NODE_AGENT_KINDS = ("DaemonSet", "NodeFeatureRule", "RuntimeClass")
WEBHOOK = "t-gpu-stack-webhook"
MONITORING = {"monitoring.prometheusRule.enabled": True}


def args(objects: list[dict[str, Any]]) -> list[str]:
    deployment = one(objects, "Deployment", WEBHOOK)
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("overlay", ["policy-only-gpu-operator.yaml", "policy-only-device-plugin.yaml"])
def test_policy_only_installs_no_node_agent_and_keeps_admission_and_monitoring(overlay: str) -> None:
    objects = render(overlay=overlay, set_json=MONITORING).objects()
    assert [(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] in NODE_AGENT_KINDS] == []
    assert find(objects, "ValidatingWebhookConfiguration") and find(objects, "MutatingWebhookConfiguration")
    assert find(objects, "PrometheusRule")
    assert [cm for cm in find(objects, "ConfigMap") if cm["metadata"].get("labels", {}).get("grafana_dashboard")]
    assert find(objects, "ClusterRole", "t-gpu-stack-inspect")


def test_gpu_operator_overlay_reads_the_cluster_policy() -> None:
    objects = render(overlay="policy-only-gpu-operator.yaml").objects()
    argv = args(objects)
    assert option(argv, "--policy-source") == "gpu-operator"
    assert option(argv, "--cluster-policy") == "cluster-policy"
    assert option(argv, "--operator-namespace") == "gpu-operator"
    assert option(argv, "--operator-service-account") == "gpu-operator"
    assert option(argv, "--runtime-classes") == "live"
    assert option(argv, "--policy-source-interval") == "2s"
    assert option(argv, "--policy-source-keep") == "10s"  # webhook.policySource.keepLastGoodRead
    rules = one(objects, "ClusterRole", f"{WEBHOOK}-policy-source")["rules"]
    assert rules == [{"apiGroups": ["nvidia.com"], "resources": ["clusterpolicies"],
                      "resourceNames": ["cluster-policy"], "verbs": ["get"]}]
    role = one(objects, "Role", f"{WEBHOOK}-policy-source")
    assert role["metadata"]["namespace"] == "gpu-operator"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
                             {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get"]}]
    binding = one(objects, "RoleBinding", f"{WEBHOOK}-policy-source")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": WEBHOOK, "namespace": "gpu-stack"}]


def test_device_plugin_overlay_reads_one_configmap() -> None:
    objects = render(overlay="policy-only-device-plugin.yaml",
                     set_json={"webhook.policySource.devicePlugin.defaultConfig": "ts"}).objects()
    argv = args(objects)
    assert option(argv, "--policy-source") == "device-plugin"
    assert option(argv, "--plugin-configmap") == "nvidia-device-plugin/nvidia-device-plugin-configs"
    assert option(argv, "--plugin-default-config") == "ts"
    assert not find(objects, "ClusterRole", f"{WEBHOOK}-policy-source")
    role = one(objects, "Role", f"{WEBHOOK}-policy-source")
    assert role["metadata"]["namespace"] == "nvidia-device-plugin"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "resourceNames": ["nvidia-device-plugin-configs"], "verbs": ["get"]}]


def test_inspect_may_read_what_the_webhook_reads() -> None:
    subjects = [{"kind": "Group", "name": "gpu-users", "apiGroup": "rbac.authorization.k8s.io"}]
    objects = render(overlay="policy-only-gpu-operator.yaml", set_json={"inspect.rbac.subjects": subjects}).objects()
    rules = one(objects, "ClusterRole", "t-gpu-stack-inspect")["rules"]
    assert {"apiGroups": ["nvidia.com"], "resources": ["clusterpolicies"], "resourceNames": ["cluster-policy"],
            "verbs": ["get"]} in rules
    binding = one(objects, "RoleBinding", "t-gpu-stack-inspect-policy-source")
    assert binding["metadata"]["namespace"] == "gpu-operator"
    assert binding["roleRef"]["name"] == f"{WEBHOOK}-policy-source"
    assert binding["subjects"] == subjects
    plugin = render(overlay="policy-only-device-plugin.yaml").objects()
    assert {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["nvidia-device-plugin-configs"],
            "verbs": ["get"]} in one(plugin, "ClusterRole", "t-gpu-stack-inspect")["rules"]


def test_validation_both_keeps_the_webhook_that_follows_the_cluster() -> None:
    objects = render(overlay="policy-only-gpu-operator.yaml",
                     set_json={"webhook.validation.mode": "both", "webhook.cel.assumeServed": True,
                               "webhook.policySource.gpuOperator.namespace": "nvidia"}).objects()
    policies = find(objects, "ValidatingAdmissionPolicy")
    assert policies
    assert option(args(objects), "--policy-source") == "gpu-operator"
    # CEL cannot look up owners: it leaves the operator's requests in its namespace to the webhook.
    for policy in policies:
        assert policy["spec"]["matchConditions"] == [{"name": "not-the-gpu-operators-own", "expression": (
            '!(request.namespace == "nvidia" && request.userInfo.username in ['
            '"system:serviceaccount:nvidia:gpu-operator", "system:serviceaccount:nvidia:nvidia-operator-validator", '
            '"system:serviceaccount:kube-system:daemon-set-controller", '
            '"system:kube-controller-manager"])')}]


def test_device_plugin_overlay_judges_every_pod_as_under_the_nvidia_runtime() -> None:
    """The device-plugin chart runs beside a toolkit it does not manage, made the default runtime as that
    chart's README asks: the overlay's policy file says so, and the live configs keep it."""
    policy = next(yaml.safe_load(cm["data"]["policy.yaml"]) for cm in find(
        render(overlay="policy-only-device-plugin.yaml").objects(), "ConfigMap") if "policy.yaml" in cm["data"])
    base = parse_config(policy)
    config = device_plugin_policy(base, "ConfigMap nvidia-device-plugin/configs", {"default": "version: v1\n"})
    assert (config.nvidia_runtime_is_default, config.envvar_when_unprivileged) == (True, True)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
           "spec": {"containers": [{"name": "c", "image": "cuda",
                                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}
    assert [f.rule_id for f in Policy(config).evaluate(pod, "Pod").denials] == ["GPU002"]


def test_values_mode_reads_no_policy_source_but_the_runtime_classes() -> None:
    objects = render().objects()
    argv = args(objects)
    assert "--policy-source" not in argv
    assert not [o for o in objects if o["metadata"]["name"].endswith("-policy-source")]
    assert option(argv, "--runtime-classes") == "live"  # with webhook.lookups.enabled, the default
    assert {"apiGroups": ["node.k8s.io"], "resources": ["runtimeclasses"], "verbs": ["get", "list"]} in \
        one(objects, "ClusterRole", WEBHOOK)["rules"]
    offline = render(set_json={"webhook.lookups.enabled": False}).objects()
    assert "--runtime-classes" not in args(offline)
    assert not any(rule.get("resources") == ["runtimeclasses"] for role in find(offline, "ClusterRole")
                   for rule in role.get("rules") or [])


def policy_file(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return next(yaml.safe_load(cm["data"]["policy.yaml"]) for cm in find(objects, "ConfigMap")
                if "policy.yaml" in cm.get("data", {}))


def toolkit_handlers(runtime_name: str) -> set[str]:
    """The runtime handlers nvidia-ctk-installer v1.20.0 registers for NVIDIA_RUNTIME_NAME (its
    cmd/nvidia-ctk-installer/container/operator/operator.go GetRuntimes: the name, nvidia-cdi, nvidia-legacy;
    a name that is one of the mode runtimes' becomes `nvidia`)."""
    return {runtime_name if runtime_name not in ("nvidia-cdi", "nvidia-legacy") else "nvidia",
            "nvidia-cdi", "nvidia-legacy"}


@pytest.mark.parametrize("runtime_class", ["nvidia", "gpu"])
def test_every_handler_the_charts_toolkit_registers_is_the_nvidia_runtime(runtime_class: str) -> None:
    objects = render(set_json={"toolkit.runtimeClass.name": runtime_class,
                               "gpuNodes.runtimeClassName": runtime_class}).objects()
    [toolkit] = [d for d in find(objects, "DaemonSet") if d["metadata"]["name"].endswith("container-toolkit")]
    env = {e["name"]: e.get("value") for e in toolkit["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_RUNTIME_NAME"] == runtime_class
    handlers = set(policy_file(objects)["nvidiaRuntimeHandlers"])
    assert toolkit_handlers(runtime_class) <= handlers
    # the one RuntimeClass the chart creates is one of them
    assert [(rc["metadata"]["name"], rc["handler"]) for rc in find(objects, "RuntimeClass")] == \
        [(runtime_class, runtime_class)]
