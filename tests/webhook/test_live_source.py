"""The policy derived from the GPU Operator's ClusterPolicy or the device-plugin chart's ConfigMap
(policy/live.py), read through the KubeApi (kube/live.py) and followed by the serving policy
(server/live_policy.py).

Upstream facts pinned here (github.com/NVIDIA/gpu-operator, tag v26.7.0, and k8s-device-plugin v0.20.0):
- tests/fixtures/gpu-operator-v26.7.0/clusterpolicy.yaml is deployments/gpu-operator/templates/clusterpolicy.yaml
  rendered with the chart's default values (tests/fixtures/README.md): `mig.strategy: single`,
  `cdi.enabled: true`, no `devicePlugin.config`, `operator.runtimeClass: nvidia`.
- controllers/object_controls.go: transformDevicePluginCtrForCDI sets DEVICE_LIST_STRATEGY=
  cdi-annotations,cdi-cri; applyMIGConfiguration sets MIG_STRATEGY from mig.strategy; devicePlugin.env is
  applied after both; transformToolkitCtrForCDI sets NVIDIA_RUNTIME_SET_AS_DEFAULT=false;
  handleDevicePluginConfig / transformConfigManager*Container: DEFAULT_CONFIG = devicePlugin.config.default,
  FALLBACK_STRATEGIES=empty.
- api/nvidia/v1/clusterpolicy_types.go CDIConfigSpec.IsEnabled: true when unset (v25.3.0: false).
- k8s-device-plugin v0.20.0 cmd/config-manager/main.go updateConfigName: a DEFAULT_CONFIG that names no
  config is an error; the `empty` fallback selects no config file (the plugin's built-in one).
- k8s-device-plugin v0.20.0 deployments/helm/nvidia-device-plugin/values.yaml: config.fallbackStrategies
  ["named", "single"].
- nvidia-container-toolkit v1.20.0 cmd/nvidia-ctk-installer/main_test.go ("no args"): the installed config
  says accept-nvidia-visible-devices-envvar-when-unprivileged = true; toolkit.go reads
  ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED, which the operator does not set.
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_dev import operator_cases
from gpu_stack_webhook.admission import decide
from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.admission.requests import admission_review
from gpu_stack_webhook.admission.review import parse_review
from gpu_stack_webhook.kube.client import Forbidden
from gpu_stack_webhook.kube.live import DevicePluginReader, OperatorReader
from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.policy.live import (
    EMPTY_CONFIG,
    SourceError,
    device_plugin_policy,
    operator_policy,
    read_cluster_policy,
)
from gpu_stack_webhook.policy.sharing import SharingIndex, Strategy
from gpu_stack_webhook.server.live_policy import LivePolicy

from .kube_fake import FakeKube
from .podlib import container, make_pod

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TIME_SLICING = """version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: {replicas}
"""
MPS = """version: v1
sharing:
  mps:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""


def cluster_policy(version: str = "v26.7.0") -> dict[str, Any]:
    return dict(yaml.safe_load((FIXTURES / f"gpu-operator-{version}" / "clusterpolicy.yaml").read_text()))


def with_plugin_config(obj: dict[str, Any], name: str = "time-slicing-config", default: str = "any") -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["spec"]["devicePlugin"]["config"] = {"name": name, "default": default}
    return obj


def exposed(config: PolicyConfig, name: str | None = None) -> dict[str, tuple[Strategy, int]]:
    node = SharingIndex(config).configs[name or config.sharing.default_config]
    return {r.name: (r.strategy, r.replicas) for r in node.exposed.values()}


def verdict(config: PolicyConfig, pod: dict[str, Any]) -> tuple[bool, str]:
    decision = decide.review(Policy(config), parse_review(admission_review(pod)), Endpoint.VALIDATE)
    return decision.allowed, decision.message or ""


# --- what the upstream defaults are ---------------------------------------------------------------------


@pytest.mark.parametrize("version", ["v26.7.0", "v26.3.0"])
def test_default_cluster_policy_of_supported_operators(version: str) -> None:
    settings = read_cluster_policy(cluster_policy(version))
    assert (settings.version, settings.plugin_config, settings.mig_strategy) == (version, "", "single")
    assert settings.device_list_strategy == ("cdi-annotations", "cdi-cri")
    assert settings.nvidia_runtime_is_default is False  # CDI: nvidia is not containerd's default runtime
    assert settings.runtime_class == "nvidia"
    assert settings.envvar_when_unprivileged is True  # the toolkit's default, which the operator keeps


def test_default_operator_policy_is_the_plugins_built_in_config() -> None:
    config = operator_policy(PolicyConfig(), read_cluster_policy(cluster_policy()), None)
    assert config.sharing.default_config == EMPTY_CONFIG
    assert list(config.sharing.configs) == [EMPTY_CONFIG]
    node = SharingIndex(config).configs[EMPTY_CONFIG]
    assert (node.mig_strategy, node.list_overrides_image_env) == ("single", True)
    assert exposed(config) == {"nvidia.com/gpu": (Strategy.EXCLUSIVE, 1)}
    assert (config.nvidia_runtime_is_default, config.inject_runtime_class_name) == (False, "")
    assert "nvidia" in config.gpu_runtime_class_names


def test_the_operators_runtime_class_declared_non_gpu_is_named_as_such() -> None:
    declared = PolicyConfig(nonGpuRuntimeClassNames=["nvidia"], gpuRuntimeClassNames=[])
    with pytest.raises(SourceError) as raised:
        operator_policy(declared, read_cluster_policy(cluster_policy()), None)
    assert str(raised.value).startswith("ClusterPolicy cluster-policy operator.runtimeClass nvidia is the NVIDIA "
                                        "runtime, but nonGpuRuntimeClassNames declares it is not")


def test_operator_time_slicing_configmap_and_overrides() -> None:
    obj = with_plugin_config(cluster_policy())
    obj["spec"]["mig"]["strategy"] = "mixed"
    data = {"any": TIME_SLICING.format(replicas=4), "mps": MPS}
    config = operator_policy(PolicyConfig(), read_cluster_policy(obj), data)
    assert config.sharing.default_config == "any"
    assert exposed(config) == {"nvidia.com/gpu": (Strategy.TIME_SLICING, 4)}
    assert exposed(config, "mps") == {"nvidia.com/gpu": (Strategy.MPS, 4)}
    # mig.strategy reaches the plugin as MIG_STRATEGY, which outranks every config file's migStrategy
    assert {c.flags.mig_strategy for c in config.sharing.configs.values()} == {"mixed"}


def test_device_plugin_env_wins_over_the_operator() -> None:
    obj = cluster_policy()
    obj["spec"]["devicePlugin"]["env"] = [{"name": "DEVICE_LIST_STRATEGY", "value": "cdi-cri"},
                                          {"name": "MIG_STRATEGY", "value": "none"}]
    obj["spec"]["toolkit"]["env"] = [{"name": "NVIDIA_RUNTIME_SET_AS_DEFAULT", "value": "true"}]
    config = operator_policy(PolicyConfig(), read_cluster_policy(obj), None)
    node = SharingIndex(config).configs[EMPTY_CONFIG]
    assert (node.mig_strategy, node.list_overrides_image_env) == ("none", False)
    assert config.nvidia_runtime_is_default is True


def test_toolkit_env_can_refuse_the_variable() -> None:
    obj = cluster_policy()
    obj["spec"]["toolkit"]["env"] = [{"name": "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED",
                                      "value": "false"}]
    config = operator_policy(PolicyConfig(), read_cluster_policy(obj), None)
    assert config.envvar_when_unprivileged is False
    assert verdict(config, make_pod([container("main")], runtimeClassName="nvidia"))[0]
    obj["spec"]["toolkit"]["enabled"] = False  # a toolkit the operator does not manage: its default assumed
    assert read_cluster_policy(obj).envvar_when_unprivileged is True


def test_cdi_off_means_nvidia_is_the_default_runtime() -> None:
    obj = cluster_policy()
    obj["spec"]["cdi"]["enabled"] = False
    settings = read_cluster_policy(obj)
    assert (settings.nvidia_runtime_is_default, settings.device_list_strategy) == (True, None)


# --- the verdict table of docs/gpu-operator.md ----------------------------------------------------------


@pytest.mark.parametrize("nri", [False, True])
def test_the_webhook_answers_what_the_cases_expect(nri: bool) -> None:
    """The verdicts are written by hand (operator_cases.Case.expect); the webhook, offline on the same
    ClusterPolicy and RuntimeClasses, must give each of them."""
    assert operator_cases.answers(nri) == operator_cases.expected(nri)


def test_every_case_says_why() -> None:
    for case in operator_cases.CASES:
        assert case.expect and case.why, case.name
        rules = case.expect.removeprefix("denied: ").split(", ") if case.expect.startswith("denied") else []
        assert all(rule in case.why for rule in rules), (case.name, case.why)


def test_the_table_shows_the_hand_written_verdicts() -> None:
    rows = {line.split("|")[1].strip(" `"): [cell.strip() for cell in line.split("|")[4:6]]
            for line in operator_cases.table().splitlines()[2:]}
    for case in operator_cases.CASES:
        assert rows[case.name][0].startswith(case.expect) and rows[case.name][1] == case.expected(nri=True)


@pytest.mark.parametrize("nri", [False, True])
def test_what_is_open_out_of_the_box_is_closed_with_gpu_stack(nri: bool) -> None:
    """The table is generated from these verdicts (gpu_stack_dev/operator_cases.py, tests/test_generated.py);
    this is what it must say: every way to GPUs a pod was not given is closed."""
    answers = operator_cases.expected(nri)
    for case in operator_cases.CASES:
        opens = case.out_of_the_box.startswith("open") or (nri and "open in NRI mode" in case.out_of_the_box)
        if opens and case.name != "privileged-no-gpu":  # not a GPU pod: Pod Security's to refuse
            assert answers[case.name].startswith(("denied", "refused")), (case.name, answers[case.name])
    assert answers["one-gpu"] == "allowed" and answers["env-without-runtime-class"] == "allowed"
    assert answers["other-runtime-class"] == "allowed"


# --- refusing to guess ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "message"), [
    (lambda o: o["metadata"]["labels"].update({"app.kubernetes.io/version": "v25.3.0"}),
     "GPU Operator version v25.3.0 is not supported"),
    (lambda o: o["metadata"]["labels"].update({"app.kubernetes.io/version": "v27.1.0"}),
     "GPU Operator version v27.1.0 is not supported"),
    (lambda o: o["metadata"]["labels"].pop("app.kubernetes.io/version"), "no app.kubernetes.io/version label"),
    (lambda o: o.update({"apiVersion": "nvidia.com/v2"}),
     "apiVersion nvidia.com/v2 kind ClusterPolicy is not supported"),
    (lambda o: o["spec"]["mig"].update({"strategy": 3}), "spec.mig.strategy is not a string"),
    (lambda o: o["spec"]["cdi"].update({"enabled": "yes"}), "spec.cdi.enabled is not a boolean"),
    (lambda o: o["spec"]["devicePlugin"].update({"enabled": False}), "devicePlugin.enabled is false"),
])
def test_a_cluster_policy_is_understood_or_refused(change: Any, message: str) -> None:
    obj = cluster_policy()
    change(obj)
    with pytest.raises(SourceError, match=message):
        read_cluster_policy(obj)


@pytest.mark.parametrize(("data", "default", "message"), [
    (None, "any", "ConfigMap gpu-operator/time-slicing-config .* does not exist"),
    ({}, "any", "holds no device plugin config"),
    ({"any": "version: v1\nsharing: [\n"}, "any", "key any: not valid YAML"),
    ({"other": TIME_SLICING.format(replicas=2)}, "any", "has no config 'any'"),
    ({"any": TIME_SLICING.format(replicas=0)}, "any", "would reject.*replicas"),
    ({"any": "version: v2\n"}, "any", "would reject.*version"),
])
def test_an_operator_configmap_the_plugin_would_reject_is_refused(data: Any, default: str, message: str) -> None:
    settings = read_cluster_policy({**with_plugin_config(cluster_policy(), default=default),
                                    "status": {"namespace": "gpu-operator"}})
    with pytest.raises(SourceError, match=message):
        operator_policy(PolicyConfig(), settings, data)


def test_device_plugin_chart_fallbacks() -> None:
    one = device_plugin_policy(PolicyConfig(), "ConfigMap p/c", {"ts": TIME_SLICING.format(replicas=3)})
    assert (one.sharing.default_config, exposed(one)) == ("ts", {"nvidia.com/gpu": (Strategy.TIME_SLICING, 3)})
    named = device_plugin_policy(PolicyConfig(), "ConfigMap p/c", {"default": "version: v1\n", "mps": MPS})
    assert named.sharing.default_config == "default"
    chosen = device_plugin_policy(PolicyConfig(), "ConfigMap p/c", {"default": "version: v1\n", "mps": MPS}, "mps")
    assert chosen.sharing.default_config == "mps"
    with pytest.raises(SourceError, match="several configs and none named default"):
        device_plugin_policy(PolicyConfig(), "ConfigMap p/c", {"a": "version: v1\n", "b": MPS})


# --- read from the API, followed without a restart -----------------------------------------------------


GPU_POD = make_pod([container("main", gpu=2)])


def test_reader_fails_closed_naming_what_is_missing() -> None:
    fake = FakeKube()
    reader = OperatorReader(fake, "cluster-policy", "gpu-operator")
    config = reader(PolicyConfig())
    assert config.source_error.startswith("ClusterPolicy cluster-policy does not exist")
    allowed, message = verdict(config, GPU_POD)
    assert not allowed
    assert "GPU010" in message and "ClusterPolicy cluster-policy does not exist" in message
    assert verdict(config, make_pod([container("main")]))[0]

    fake.cluster_policies["cluster-policy"] = with_plugin_config(cluster_policy())
    fake.fail_next["read_configmap_data"] = [Forbidden(403, "Forbidden", 'configmaps "time-slicing-config" is '
                                                        'forbidden')]
    message = reader(PolicyConfig()).source_error
    assert message.startswith("no permission to get configmap time-slicing-config in namespace gpu-operator")


def test_live_policy_follows_a_configmap_and_mig_change() -> None:
    fake = FakeKube()
    fake.cluster_policies["cluster-policy"] = with_plugin_config(cluster_policy())
    strict = TIME_SLICING.format(replicas=4).replace(
        "  timeSlicing:\n", "  timeSlicing:\n    failRequestsGreaterThanOne: true\n")
    fake.configmap_data[("gpu-operator", "time-slicing-config")] = {"any": strict}
    live = LivePolicy(None, PolicyConfig(), OperatorReader(fake, "cluster-policy", "gpu-operator"), interval=3600)
    assert [f.rule_id for f in live.current.evaluate(GPU_POD, "Pod").denials] == ["GPU004"]  # 2 of a shared GPU

    fake.configmap_data[("gpu-operator", "time-slicing-config")] = {"any": "version: v1\n"}
    assert live.refresh() is True
    assert live.current.evaluate(GPU_POD, "Pod").denials == []

    mig_pod = make_pod([container("main", requests={"nvidia.com/mig-1g.5gb": 1}, limits={"nvidia.com/mig-1g.5gb": 1})])
    assert [f.rule_id for f in live.current.evaluate(mig_pod, "Pod").denials] == ["GPU005"]  # single: no MIG names
    fake.cluster_policies["cluster-policy"]["spec"]["mig"]["strategy"] = "mixed"
    assert live.refresh() is True
    assert live.current.evaluate(mig_pod, "Pod").denials == []
    assert live.refresh() is False  # nothing changed, nothing rebuilt


def test_live_policy_reads_in_the_background_of_each_process() -> None:
    fake = FakeKube()
    fake.configmap_data[("plugins", "configs")] = {"default": "version: v1\n"}
    live = LivePolicy(None, PolicyConfig(), DevicePluginReader(fake, "plugins", "configs"), interval=0.01)
    before = live()
    assert before.config.source_error == ""
    changed = threading.Event()
    fake.configmap_data.pop(("plugins", "configs"))
    for _ in range(500):
        if live.current is not before:
            changed.set()
            break
        changed.wait(0.01)
    assert changed.is_set()
    assert live().config.source_error == "ConfigMap plugins/configs does not exist"
