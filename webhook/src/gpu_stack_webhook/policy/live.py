"""The policy where the GPUs already are: the webhook's PolicyConfig completed from what NVIDIA's GPU
Operator or device-plugin chart runs with (docs/gpu-operator.md). Pure: server/live_source.py reads the
objects from the API and calls these functions; the result is the same PolicyConfig a policy file gives,
so one code path judges pods.

What is taken from the cluster replaces, in the chart's policy file: `sharing` (the device plugin config
files, the node config label and the default config), `nvidiaRuntimeIsDefault`, `injectRuntimeClassName`,
and the operator's runtime class joins `gpuRuntimeClassNames`. Everything else (exempt namespaces, MPS
opt-in, rules, DRA) stays as the chart rendered it.

GPU Operator (github.com/NVIDIA/gpu-operator, read at v26.7.0; the same for v25.10 and v26.3):
- controllers/object_controls.go TransformDevicePlugin / handleDevicePluginConfig: with
  `devicePlugin.config.name` the plugin reads the ConfigMap of that name in the operator's namespace
  through its config-manager (node label nvidia.com/device-plugin.config, DEFAULT_CONFIG =
  `devicePlugin.config.default`, FALLBACK_STRATEGIES=empty: an unlabelled node without a default runs
  the plugin's built-in config); without it, the built-in config.
- applyMIGConfiguration: MIG_STRATEGY = `mig.strategy` when set; transformDevicePluginCtrForCDI:
  DEVICE_LIST_STRATEGY=cdi-annotations,cdi-cri when `cdi.enabled` (api/nvidia/v1/clusterpolicy_types.go
  CDIConfigSpec.IsEnabled: true when unset); `devicePlugin.env` is applied last and wins. The plugin's
  environment outranks its config file (k8s-device-plugin v0.20 api/config/v1/config.go NewConfig,
  flags set from the environment override the file).
- transformToolkitCtrForCDI: with CDI the toolkit sets NVIDIA_RUNTIME_SET_AS_DEFAULT=false (`nvidia` is
  not the default runtime) unless `toolkit.env` says otherwise. Without CDI, or with the toolkit not
  managed by the operator, the webhook assumes the NVIDIA runtime is the default (it cannot assume less).

device-plugin chart (k8s-device-plugin v0.20.0 deployments/helm/nvidia-device-plugin): `config.name` (or
`<fullname>-configs` built from `config.map`) holds the named config files; `config.default`, else the
fallbacks `named` ("default") and `single` (the only config).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_stack_webhook.policy.config import ConfigError, PolicyConfig, parse_config
from gpu_stack_webhook.policy.plugin_inputs import SourceError, plugin_config_files, plugin_flags

CLUSTER_POLICY_API_VERSION = "nvidia.com/v1"
CLUSTER_POLICY_KIND = "ClusterPolicy"
# The label the GPU Operator's Helm chart puts on the ClusterPolicy it renders (templates/clusterpolicy.yaml).
VERSION_LABEL = "app.kubernetes.io/version"
# GPU Operator release series whose ClusterPolicy means what this module reads (CDI on when unset,
# `cdi.default` ignored). v25.3 and older read `cdi.enabled` as off when unset and honour `cdi.default`.
SUPPORTED_OPERATOR_SERIES = ("v25.10", "v26.3", "v26.7")
NODE_CONFIG_LABEL = "nvidia.com/device-plugin.config"
# The config a node runs when the config-manager falls back to an empty config (FALLBACK_STRATEGIES=empty):
# not a valid label value, so no node label can name it.
EMPTY_CONFIG = "(built-in)"
DEFAULT_RUNTIME_CLASS = "nvidia"
_HANDLER = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@dataclass(frozen=True)
class OperatorSettings:
    """What one ClusterPolicy says about the facts the policy needs."""

    name: str
    version: str
    # The operator's namespace (status.namespace): where its device plugin ConfigMap lives.
    namespace: str
    plugin_config: str  # devicePlugin.config.name ("" = the plugin's built-in config)
    default_config: str  # devicePlugin.config.default
    mig_strategy: str | None  # what the plugin's environment sets, None: the config file decides
    device_list_strategy: tuple[str, ...] | None
    nvidia_runtime_is_default: bool
    runtime_class: str
    # The toolkit honours NVIDIA_VISIBLE_DEVICES from unprivileged containers.
    envvar_when_unprivileged: bool = True
    # The toolkit runs its NRI plugin (spec.cdi.nriPluginEnabled, toolkit.env ENABLE_NRI_PLUGIN), which injects
    # what nvidia.cdi.k8s.io/ annotations name.
    nri_plugin_enabled: bool = False
    uid: str = ""
    # toolkit.env NVIDIA_RUNTIME_NAME: another runtime handler the toolkit registers ("" = not set).
    runtime_name: str = ""


def _section(spec: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    node: Any = spec
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
        if node is None:
            return {}
    if not isinstance(node, Mapping):
        raise SourceError(f"spec.{path} is not an object")
    return node


def _string(section: Mapping[str, Any], key: str, where: str) -> str:
    value = section.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SourceError(f"{where}.{key} is not a string: {value!r}")
    return value


def _flag(section: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = section.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise SourceError(f"{where}.{key} is not a boolean: {value!r}")
    return value


def _env(section: Mapping[str, Any], where: str) -> dict[str, str]:
    entries = section.get("env")
    if entries is None:
        return {}
    if not isinstance(entries, list):
        raise SourceError(f"{where}.env is not a list")
    env: dict[str, str] = {}
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise SourceError(f"{where}.env[{index}] has no name")
        value = entry.get("value")
        if value is not None and not isinstance(value, str):
            raise SourceError(f"{where}.env[{index}] ({entry['name']}) value is not a string: {value!r}")
        env[entry["name"]] = value or ""
    return env


# How the toolkit reads a boolean from its environment: urfave/cli v3 BoolFlag (nvidia-container-toolkit v1.20.0
# vendor/github.com/urfave/cli/v3/flag_bool.go, strconv.ParseBool; flag_impl.go: an empty value is false). Any
# other value stops the toolkit ("could not parse ..."), so the policy cannot say what the node runs.
_PARSE_BOOL = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True, "": False,
               "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}


def _env_flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    if name not in env:
        return default
    value = env[name]
    if value not in _PARSE_BOOL:
        raise SourceError(f"spec.toolkit.env {name}={value!r} is not a boolean the toolkit reads (strconv.ParseBool: "
                          f"true, false, 1, 0, t, f): the toolkit would not start with it")
    return _PARSE_BOOL[value]


def operator_version(obj: Mapping[str, Any]) -> str:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return str(labels.get(VERSION_LABEL) or "")


def _supported(version: str) -> bool:
    return any(version == series or version.startswith(series + ".") for series in SUPPORTED_OPERATOR_SERIES)


def read_cluster_policy(obj: Mapping[str, Any]) -> OperatorSettings:
    """The facts of one ClusterPolicy, or SourceError naming the schema version it refuses or the field
    it cannot read. Nothing is half-read: any field of the wrong type refuses the whole object."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    what = f"ClusterPolicy {name}"
    api_version = obj.get("apiVersion")
    if api_version != CLUSTER_POLICY_API_VERSION or obj.get("kind") != CLUSTER_POLICY_KIND:
        raise SourceError(f"{what}: apiVersion {api_version} kind {obj.get('kind')} is not supported "
                          f"(gpu-stack reads {CLUSTER_POLICY_KIND} {CLUSTER_POLICY_API_VERSION})")
    version = operator_version(obj)
    if not version:
        raise SourceError(f"{what}: no {VERSION_LABEL} label, so its GPU Operator version (and schema) is "
                          f"unknown; gpu-stack reads those of GPU Operator {', '.join(SUPPORTED_OPERATOR_SERIES)}")
    if not _supported(version):
        raise SourceError(f"{what}: GPU Operator version {version} is not supported; gpu-stack reads the "
                          f"ClusterPolicy of GPU Operator {', '.join(SUPPORTED_OPERATOR_SERIES)}")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise SourceError(f"{what}: no spec")
    try:
        return _settings(name, version, obj, spec)
    except SourceError as exc:
        raise SourceError(f"{what} (GPU Operator {version}): {exc}") from None


def _settings(name: str, version: str, obj: Mapping[str, Any], spec: Mapping[str, Any]) -> OperatorSettings:
    plugin = _section(spec, "devicePlugin")
    if not _flag(plugin, "enabled", "spec.devicePlugin", True):
        raise SourceError("devicePlugin.enabled is false: the operator runs no device plugin whose "
                          "configuration the policy could follow")
    config = _section(spec, "devicePlugin.config")
    plugin_env = _env(plugin, "spec.devicePlugin")
    toolkit = _section(spec, "toolkit")
    toolkit_env = _env(toolkit, "spec.toolkit")
    cdi = _flag(_section(spec, "cdi"), "enabled", "spec.cdi", True)
    mig: str | None = _string(_section(spec, "mig"), "strategy", "spec.mig") or None
    mig = plugin_env.get("MIG_STRATEGY", mig)
    strategies: str | None = "cdi-annotations,cdi-cri" if cdi else None
    strategies = plugin_env.get("DEVICE_LIST_STRATEGY", strategies)
    flags = plugin_flags(plugin.get("args"))
    mig = flags.get("mig-strategy", mig)
    if mig is not None and mig not in ("none", "single", "mixed"):
        raise SourceError(f"MIG strategy {mig!r} is not none, single or mixed")
    strategies = flags.get("device-list-strategy", strategies)
    toolkit_on = _flag(toolkit, "enabled", "spec.toolkit", True)
    # toolkit.env is set on the toolkit's container after the CDI transform (gpu-operator v26.7.0
    # controllers/object_controls.go TransformToolkit, lines 1314-1363), so it outranks what the operator sets.
    runtime_default = _env_flag(toolkit_env, "NVIDIA_RUNTIME_SET_AS_DEFAULT", not (cdi and toolkit_on))
    # nvidia-container-toolkit v1.20.0 cmd/nvidia-ctk-installer/toolkit/toolkit.go: true unless the toolkit's
    # environment says otherwise (the operator sets nothing); a toolkit the operator does not manage is not
    # known: true.
    envvar = _env_flag(toolkit_env, "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED", True) or not toolkit_on
    # The NRI plugin: ENABLE_NRI_PLUGIN=true from transformToolkitCtrForCDI when CDI is on and
    # cdi.nriPluginEnabled (CDIConfigSpec.IsNRIPluginEnabled), then toolkit.env (cmd/nvidia-ctk-installer/main.go
    # --enable-nri-plugin). GPU007 denies the NRI annotations whatever this says; it is reported, not relied on.
    nri = _flag(_section(spec, "cdi"), "nriPluginEnabled", "spec.cdi", False) and cdi
    nri = _env_flag(toolkit_env, "ENABLE_NRI_PLUGIN", nri) and toolkit_on
    # The runtime handler the toolkit registers (nvidia-container-toolkit v1.20.0
    # cmd/nvidia-ctk-installer/container/runtime/runtime.go --runtime-name: NVIDIA_RUNTIME_NAME, then the
    # operator's CONTAINERD_RUNTIME_CLASS; container/operator/operator.go GetRuntimes: that name, "nvidia" when
    # empty or one of the mode runtimes, besides nvidia-cdi and nvidia-legacy).
    runtime_name = toolkit_env.get("NVIDIA_RUNTIME_NAME", "").strip()
    if runtime_name and not _HANDLER.fullmatch(runtime_name):
        raise SourceError(f"spec.toolkit.env NVIDIA_RUNTIME_NAME={runtime_name!r} is not a runtime handler name "
                          f"(a DNS label)")
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    assert isinstance(status, Mapping)
    return OperatorSettings(
        name=name, version=version, namespace=str(status.get("namespace") or ""),
        plugin_config=_string(config, "name", "spec.devicePlugin.config"),
        default_config=_string(config, "default", "spec.devicePlugin.config"),
        mig_strategy=mig,
        device_list_strategy=None if strategies is None else tuple(
            s.strip() for s in strategies.split(",") if s.strip()),
        nvidia_runtime_is_default=runtime_default,
        runtime_class=_string(_section(spec, "operator"), "runtimeClass", "spec.operator") or DEFAULT_RUNTIME_CLASS,
        envvar_when_unprivileged=envvar,
        nri_plugin_enabled=nri,
        runtime_name=runtime_name if toolkit_on else "",
        uid=str((obj.get("metadata") or {}).get("uid") or ""),
    )


def _with_flags(config: Mapping[str, Any], mig: str | None, strategies: tuple[str, ...] | None) -> dict[str, Any]:
    out = dict(config)
    flags = dict(out.get("flags") or {})
    if mig is not None:
        flags["migStrategy"] = mig
    if strategies is not None:
        flags["plugin"] = {**dict(flags.get("plugin") or {}), "deviceListStrategy": list(strategies)}
    out["flags"] = flags
    return out


def _policy(base: PolicyConfig, where: str, configs: dict[str, dict[str, Any]], default: str,
            **updates: Any) -> PolicyConfig:
    data = base.model_dump(by_alias=True, mode="json", exclude={"sharing"})
    data.update(updates)
    data["sharing"] = {"nodeConfigLabel": NODE_CONFIG_LABEL, "defaultConfig": default, "configs": configs}
    try:
        return parse_config(data, where)
    except ConfigError as exc:
        raise SourceError(str(exc).replace("invalid policy config: ", "a config the device plugin would reject: ")
                          ) from None


def operator_policy(base: PolicyConfig, settings: OperatorSettings, data: Mapping[str, str] | None) -> PolicyConfig:
    """The policy on a cluster whose GPUs the operator runs: `data` is the ConfigMap named by
    devicePlugin.config (None when it names none)."""
    where = f"ConfigMap {settings.namespace}/{settings.plugin_config}"
    if settings.plugin_config:
        if data is None:
            raise SourceError(f"{where} (ClusterPolicy {settings.name} devicePlugin.config.name) does not exist")
        files = plugin_config_files(data, where)
    else:
        files = {}
    default = settings.default_config
    if not settings.plugin_config:
        default = EMPTY_CONFIG
    elif not default:
        default = EMPTY_CONFIG  # FALLBACK_STRATEGIES=empty
    elif default not in files:
        raise SourceError(f"{where} has no config {default!r} (ClusterPolicy {settings.name} "
                          f"devicePlugin.config.default): the device plugin on unlabelled nodes would not start")
    if default == EMPTY_CONFIG:
        files[EMPTY_CONFIG] = {"version": "v1"}
    configs = {n: _with_flags(c, settings.mig_strategy, settings.device_list_strategy) for n, c in files.items()}
    if settings.runtime_class in base.non_gpu_runtime_class_names:
        raise SourceError(f"ClusterPolicy {settings.name} operator.runtimeClass {settings.runtime_class} is the NVIDIA "
                          "runtime, but nonGpuRuntimeClassNames declares it is not: remove it from "
                          "webhook.policy.nonGpuRuntimeClassNames")
    runtime_classes = list(dict.fromkeys([*base.gpu_runtime_class_names, settings.runtime_class]))
    # The operator names the toolkit's runtime handler after its runtime class (CONTAINERD_RUNTIME_CLASS,
    # getRuntimeClassName) and creates the RuntimeClass with that handler.
    # toolkit.env NVIDIA_RUNTIME_NAME renames the handler the toolkit registers.
    handlers = list(dict.fromkeys([*base.nvidia_runtime_handlers, settings.runtime_class,
                                   *([settings.runtime_name] if settings.runtime_name else [])]))
    operator = base.gpu_operator.model_copy(update={"namespace": settings.namespace, "cluster_policy_uid": settings.uid}
                                            ) if base.gpu_operator is not None else None
    return _policy(base, where, configs, default, nvidiaRuntimeIsDefault=settings.nvidia_runtime_is_default,
                   injectRuntimeClassName="", gpuRuntimeClassNames=runtime_classes,
                   envvarWhenUnprivileged=settings.envvar_when_unprivileged, nvidiaRuntimeHandlers=handlers,
                   nriPluginEnabled=settings.nri_plugin_enabled,
                   gpuOperator=None if operator is None else operator.model_dump(by_alias=True))


def device_plugin_policy(base: PolicyConfig, where: str, data: Mapping[str, str] | None,
                         default_config: str = "") -> PolicyConfig:
    """The policy on a cluster that runs the device-plugin chart with the config ConfigMap `data`
    (`where`: "ConfigMap <namespace>/<name>"), its `config.default` being `default_config`."""
    if data is None:
        raise SourceError(f"{where} does not exist")
    files = plugin_config_files(data, where)
    if default_config:
        if default_config not in files:
            raise SourceError(f"{where} has no config {default_config!r} (the default config)")
        default = default_config
    elif "default" in files:  # fallback strategy `named`
        default = "default"
    elif len(files) == 1:  # fallback strategy `single`
        default = next(iter(files))
    else:
        raise SourceError(f"{where} has several configs and none named default: set the default config "
                          f"(the device plugin chart's config.default)")
    # The device-plugin chart does not manage the toolkit: its default (accepts the variable) is assumed.
    return _policy(base, where, files, default, envvarWhenUnprivileged=True)


def unavailable_policy(base: PolicyConfig, message: str) -> PolicyConfig:
    """The policy while the live configuration cannot be read: GPU pods are denied with `message`
    (rule GPU010), and the NVIDIA runtime counts as the default runtime (what it is cannot be known)."""
    return base.model_copy(update={"source_error": message, "nvidia_runtime_is_default": True})
