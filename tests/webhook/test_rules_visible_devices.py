"""GPU002 no-nvidia-visible-devices: no container of any pod sets NVIDIA_VISIBLE_DEVICES, by env or envFrom."""

from __future__ import annotations

from typing import Any

import pytest
from gpu_stack_webhook.policy.findings import Severity

from .podlib import ALL_KINDS, CONTAINER_KINDS, CONTAINER_LABEL, SPEC_PATH, container, make_pod, pod_with, wrap
from .policylib import config_default, decide, findings, only, summary

RULE = "GPU002"
VAR = "NVIDIA_VISIBLE_DEVICES"
CM = {"configMapRef": {"name": "gpu-env"}}
SECRET = {"secretRef": {"name": "gpu-secret"}}

# (env, envFrom, expected [(severity, path suffix)], words in the message of the first finding)
CASES = [
    # plain value "all": the runtime would hand over every GPU on the node -> deny
    pytest.param([{"name": VAR, "value": "all"}], None, [("deny", "env[0]")],
                 ("sets NVIDIA_VISIBLE_DEVICES explicitly",), id="env-value-all"),
    # a specific index "0": still picks GPUs the device plugin never allocated -> deny
    pytest.param([{"name": VAR, "value": "0"}], None, [("deny", "env[0]")], ("explicitly",), id="env-value-index"),
    # "void"/"none" look harmless but the variable is forbidden outright -> deny
    pytest.param([{"name": VAR, "value": "none"}], None, [("deny", "env[0]")], ("explicitly",), id="env-value-none"),
    # value hidden in a ConfigMap through valueFrom: same effect -> deny, message says valueFrom
    pytest.param([{"name": VAR, "valueFrom": {"configMapKeyRef": {"name": "gpu-env", "key": "d"}}}], None,
                 [("deny", "env[0]")], ("from valueFrom",), id="env-valueFrom-configmap"),
    # valueFrom a Secret -> deny
    pytest.param([{"name": VAR, "valueFrom": {"secretKeyRef": {"name": "s", "key": "d"}}}], None,
                 [("deny", "env[0]")], ("from valueFrom",), id="env-valueFrom-secret"),
    # valueFrom the downward API (e.g. an annotation the user controls) -> deny
    pytest.param([{"name": VAR, "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['d']"}}}], None,
                 [("deny", "env[0]")], ("from valueFrom",), id="env-valueFrom-fieldRef"),
    # hidden behind harmless variables: the path names the exact index -> deny env[2]
    pytest.param([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}, {"name": VAR, "value": "all"}], None,
                 [("deny", "env[2]")], ("explicitly",), id="env-third-entry"),
    # set twice: both entries reported
    pytest.param([{"name": VAR, "value": "0"}, {"name": VAR, "value": "all"}], None,
                 [("deny", "env[0]"), ("deny", "env[1]")], ("explicitly",), id="env-twice"),
    # lowercase name is a different variable the runtime ignores -> allowed
    pytest.param([{"name": "nvidia_visible_devices", "value": "all"}], None, [], (), id="env-lowercase-allowed"),
    # a longer name that merely starts with it -> allowed
    pytest.param([{"name": VAR + "_X", "value": "all"}], None, [], (), id="env-longer-name-allowed"),
    # CUDA_VISIBLE_DEVICES only filters what the container already has -> allowed
    pytest.param([{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}], None, [], (), id="cuda-visible-devices-allowed"),
    # envFrom prefix "N" + key "VIDIA_VISIBLE_DEVICES" produces the variable -> deny
    pytest.param(None, [{"prefix": "N", **CM}], [("deny", "envFrom[0]")], ('prefix "N"', 'ConfigMap "gpu-env"'),
                 id="envFrom-prefix-N"),
    # envFrom prefix "NVIDIA_" + key "VISIBLE_DEVICES" -> deny
    pytest.param(None, [{"prefix": "NVIDIA_", **CM}], [("deny", "envFrom[0]")], ('prefix "NVIDIA_"',),
                 id="envFrom-prefix-NVIDIA_"),
    # envFrom prefix "NVIDIA_VISIBLE_DEVIC" + key "ES" -> deny
    pytest.param(None, [{"prefix": "NVIDIA_VISIBLE_DEVIC", **SECRET}], [("deny", "envFrom[0]")],
                 ('Secret "gpu-secret"',), id="envFrom-prefix-almost-whole-secret"),
    # prefix equal to the whole name: a key would have to be empty (ConfigMaps forbid it), denied anyway
    pytest.param(None, [{"prefix": VAR, **CM}], [("deny", "envFrom[0]")], ('prefix "NVIDIA_VISIBLE_DEVICES"',),
                 id="envFrom-prefix-whole-name"),
    # lowercase prefix "nvidia_" can only produce lowercase names -> allowed, nothing said
    pytest.param(None, [{"prefix": "nvidia_", **CM}], [], (), id="envFrom-prefix-lowercase-allowed"),
    # a prefix that is not the start of the name ("CUDA_") -> allowed
    pytest.param(None, [{"prefix": "CUDA_", **CM}], [], (), id="envFrom-prefix-other-allowed"),
    # a prefix longer than the name cannot produce it -> allowed
    pytest.param(None, [{"prefix": VAR + "_", **CM}], [], (), id="envFrom-prefix-longer-allowed"),
    # no prefix: whatever keys the ConfigMap holds, invisible offline -> warning naming the source
    pytest.param(None, [CM], [("warn", "envFrom[0]")], ('ConfigMap "gpu-env" has no prefix',),
                 id="envFrom-no-prefix-warns"),
    # empty prefix is the same as none -> warning
    pytest.param(None, [{"prefix": "", **SECRET}], [("warn", "envFrom[0]")], ('Secret "gpu-secret" has no prefix',),
                 id="envFrom-empty-prefix-warns"),
    # several envFrom entries: each judged on its own, paths name each index
    pytest.param(None, [{"prefix": "APP_", **CM}, CM, {"prefix": "NV", **CM}],
                 [("warn", "envFrom[1]"), ("deny", "envFrom[2]")], (), id="envFrom-mixed"),
    # env and envFrom together: both reported
    pytest.param([{"name": VAR, "value": "all"}], [{"prefix": "NVIDIA_", **CM}],
                 [("deny", "env[0]"), ("deny", "envFrom[0]")], (), id="env-and-envFrom"),
]


@pytest.mark.parametrize(("env", "env_from", "expected", "words"), CASES)
def test_env_and_envfrom(env: Any, env_from: Any, expected: list[tuple[str, str]], words: tuple[str, ...]) -> None:
    pod = make_pod([container("x", env=env, env_from=env_from)])
    found = findings(pod, RULE)
    assert [(f.severity.value, f.path) for f in found] == [(s, f"spec.containers[0].{p}") for s, p in expected]
    for f in found:
        assert 'container "x"' in f.message and VAR in f.message
        assert not f.deny_early, "Kubernetes accepts the variable; only /validate denies"
    if words:
        for word in words:
            assert word in found[0].message


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("field", CONTAINER_KINDS)
@pytest.mark.parametrize("how", ["value", "valueFrom"])
def test_every_container_kind_and_workload(field: str, kind: str, how: str) -> None:
    # NVIDIA_VISIBLE_DEVICES in any container kind of any workload's pod template -> deny at its path
    entry: dict[str, Any] = {"name": VAR, "value": "all"} if how == "value" else {
        "name": VAR, "valueFrom": {"configMapKeyRef": {"name": "gpu-env", "key": "d"}}}
    obj = wrap(pod_with(field, container("x", env=[entry])), kind)
    f = only(findings(obj, RULE, kind))
    assert f.severity is Severity.DENY
    assert f.path == f"{SPEC_PATH[kind]}.{field}[0].env[0]"
    assert f.message.startswith(f'{CONTAINER_LABEL[field]} "x" sets NVIDIA_VISIBLE_DEVICES')
    assert f.text.startswith("GPU002 ") and f.text.endswith(f"({f.path})")


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("field", CONTAINER_KINDS)
def test_envfrom_prefix_in_every_container_kind_and_workload(field: str, kind: str) -> None:
    # envFrom prefix "NVIDIA_" in any container kind of any workload -> deny at envFrom[0]
    obj = wrap(pod_with(field, container("x", env_from=[{"prefix": "NVIDIA_", **CM}])), kind)
    f = only(findings(obj, RULE, kind))
    assert (f.severity, f.path) == (Severity.DENY, f"{SPEC_PATH[kind]}.{field}[0].envFrom[0]")


def test_found_behind_entries_that_are_no_object_or_have_no_name() -> None:
    # what `check` may read from YAML: an env list with a string and a nameless entry before the variable
    main = container("main")
    main["env"] = ["A=1", {"value": "2"}, {"name": VAR, "value": "all"}]
    assert summary(findings(make_pod([main]), RULE)) == [(RULE, "deny", "spec.containers[0].env[2]")]


def test_non_gpu_pod_is_judged_too() -> None:
    # a pod with no GPU request at all still may not set the variable: it would get GPUs for free
    pod = make_pod([container("x", env=[{"name": VAR, "value": "all"}])])
    decision = decide(pod, "validate")
    assert not decision.allowed and decision.code == 403
    assert decision.message == ('GPU002 container "x" sets NVIDIA_VISIBLE_DEVICES explicitly; GPUs are assigned by '
                                "the device plugin, request nvidia.com/gpu instead (spec.containers[0].env[0])")


def test_only_validate_denies() -> None:
    # /mutate lets it through (no deny_early); /validate denies
    pod = make_pod([container("x", env=[{"name": VAR, "value": "all"}])])
    assert decide(pod, "mutate").allowed
    assert not decide(pod, "validate").allowed


def test_no_prefix_warning_reaches_the_user() -> None:
    # envFrom without prefix: allowed with a kubectl Warning line
    pod = make_pod([container("x", env_from=[CM])])
    decision = decide(pod, "validate")
    assert decision.allowed
    assert decision.warnings == (
        'gpu-stack GPU002: container "x": envFrom ConfigMap "gpu-env" has no prefix; it must not hold '
        "NVIDIA_VISIBLE_DEVICES",
    )


def test_disabled_rule_reports_nothing() -> None:
    # GPU002 disabled: the variable passes
    pod = make_pod([container("x", env=[{"name": VAR, "value": "all"}])])
    config = config_default(rules={"disabled": ["GPU002"]})
    assert findings(pod, RULE, config=config) == []
    assert decide(pod, "validate", config).allowed
    assert summary(findings(pod, RULE)) == [(RULE, "deny", "spec.containers[0].env[0]")]
