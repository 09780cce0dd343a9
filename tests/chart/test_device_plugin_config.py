"""The device plugin config files the chart renders match the upstream v1 config schema field by field.

The schema below is written down from NVIDIA/k8s-device-plugin, package api/config/v1:
  - config.go   `type Config struct`: version, flags, resources, sharing, imex
                 (parseConfigFrom: version must be "v1" or empty)
  - flags.go    `type Flags struct { CommandLineFlags }`, `type CommandLineFlags struct`,
                 `type PluginCommandLineFlags struct`, `type GFDCommandLineFlags struct`,
                 `deviceListStrategyFlag` (a string or a list of strings)
  - consts.go   MigStrategy{None,Single,Mixed}, DeviceListStrategy{EnvVar,VolumeMounts,CDIAnnotations,CDICRI},
                 DeviceIDStrategy{UUID,Index}
  - sharing.go  `type Sharing struct`: timeSlicing, mps (both ReplicatedResources)
  - replicas.go `type ReplicatedResources struct` (renameByDefault, failRequestsGreaterThanOne, resources),
                 `type ReplicatedResource struct` (name, rename, devices, replicas; UnmarshalJSON requires
                 name and replicas, replicas >= 2), `ReplicatedDevices` ("all", a count > 0, or a list of
                 GPU indices / MIG indices / UUIDs)
Field names are the struct tags (`json:"..."`, which sigs.k8s.io/yaml uses to decode the file).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pytest
import yaml
from gpu_stack_dev.chartlib import FULLNAME, find, overlays, render

# A type spec is: a Python type; ("enum", {...}); ("list", spec); ("struct", FIELDS); or a callable check.
MIG_STRATEGIES = {"none", "single", "mixed"}
DEVICE_LIST_STRATEGIES = {"envvar", "volume-mounts", "cdi-annotations", "cdi-cri"}
DEVICE_ID_STRATEGIES = {"uuid", "index"}
DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
DEVICE_REF = re.compile(
    r"^([0-9]+|[0-9]+:[0-9]+|(GPU|MIG)-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"|MIG-GPU-[0-9a-fA-F-]{36}/[0-9]+/[0-9]+)$")
# resources.go NewResourceName: nvidia.com/ and a DNS-1123 subdomain (k8s.io/apimachinery NameIsDNSSubdomain).
RESOURCE_NAME = re.compile(r"^nvidia\.com/[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _device_list_strategy(value: Any) -> bool:
    items = [value] if isinstance(value, str) else value
    return isinstance(items, list) and bool(items) and all(i in DEVICE_LIST_STRATEGIES for i in items)


def _devices(value: Any) -> bool:
    if value == "all":
        return True
    if isinstance(value, int) and not isinstance(value, bool):
        return value > 0
    return isinstance(value, list) and all(
        (isinstance(i, int) and not isinstance(i, bool) and i >= 0)
        or (isinstance(i, str) and bool(DEVICE_REF.match(i)))
        for i in value)


def _replicas(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 2


def _resource_name(value: Any) -> bool:
    return isinstance(value, str) and bool(RESOURCE_NAME.match(value)) and len(value.split("/", 1)[1]) <= 63


def _duration(value: Any) -> bool:
    return isinstance(value, str) and bool(DURATION.match(value))


PLUGIN_FLAGS = {  # flags.go PluginCommandLineFlags
    "passDeviceSpecs": bool,
    "deviceListStrategy": _device_list_strategy,
    "deviceIDStrategy": ("enum", DEVICE_ID_STRATEGIES),
    "cdiAnnotationPrefix": str,
    "nvidiaCTKPath": str,
    "containerDriverRoot": str,
    "kubeletSocket": str,
    "cdiFeatureFlags": str,
}
GFD_FLAGS = {  # flags.go GFDCommandLineFlags
    "oneshot": bool,
    "noTimestamp": bool,
    "sleepInterval": _duration,
    "outputFile": str,
    "machineTypeFile": str,
}
FLAGS = {  # flags.go CommandLineFlags (embedded in Flags)
    "migStrategy": ("enum", MIG_STRATEGIES),
    "failOnInitError": bool,
    "restartOnDeviceUnhealthy": bool,
    "mpsRoot": str,
    "nvidiaDriverRoot": str,
    "nvidiaDevRoot": str,
    "gdrcopyEnabled": bool,
    "gdsEnabled": bool,
    "mofedEnabled": bool,
    "useNodeFeatureAPI": bool,
    "deviceDiscoveryStrategy": str,
    "plugin": ("struct", PLUGIN_FLAGS),
    "gfd": ("struct", GFD_FLAGS),
}
REPLICATED_RESOURCE = {  # replicas.go ReplicatedResource
    "name": _resource_name,
    "rename": str,
    "devices": _devices,
    "replicas": _replicas,
}
REPLICATED_RESOURCE_REQUIRED = {"name", "replicas"}
REPLICATED_RESOURCES = {  # replicas.go ReplicatedResources
    "renameByDefault": bool,
    "failRequestsGreaterThanOne": bool,
    "resources": ("list", ("struct", REPLICATED_RESOURCE)),
}
SHARING = {  # sharing.go Sharing
    "timeSlicing": ("struct", REPLICATED_RESOURCES),
    "mps": ("struct", REPLICATED_RESOURCES),
}
CONFIG = {  # config.go Config
    "version": ("enum", {"v1"}),
    "flags": ("struct", FLAGS),
    "resources": dict,  # Resources{gpus, migs}: disabled upstream (DisableResourceNamingInConfig); never rendered
    "sharing": ("struct", SHARING),
    "imex": dict,
}


def check(value: Any, spec: Any, path: str) -> list[str]:
    """Every problem in `value` against `spec`, each naming its path."""
    if isinstance(spec, tuple):
        kind, arg = spec
        if kind == "enum":
            return [] if value in arg else [f"{path}: {value!r} not one of {sorted(arg)}"]
        if kind == "list":
            if not isinstance(value, list):
                return [f"{path}: expected a list, got {type(value).__name__}"]
            return [p for i, item in enumerate(value) for p in check(item, arg, f"{path}[{i}]")]
        if kind == "struct":
            if not isinstance(value, Mapping):
                return [f"{path}: expected a mapping, got {type(value).__name__}"]
            problems = [f"{path}.{k}: unknown field" for k in value if k not in arg]
            problems += [p for k, v in value.items() if k in arg for p in check(v, arg[k], f"{path}.{k}")]
            if arg is REPLICATED_RESOURCE:
                problems += [f"{path}.{k}: required" for k in REPLICATED_RESOURCE_REQUIRED - set(value)]
            return problems
        raise AssertionError(kind)
    if spec is bool or spec is str or spec is dict:
        return [] if type(value) is spec else [f"{path}: expected {spec.__name__}, got {value!r}"]
    return [] if spec(value) else [f"{path}: invalid value {value!r}"]


def config_problems(config: Any, name: str) -> list[str]:
    problems = check(config, ("struct", CONFIG), name)
    if isinstance(config, Mapping):
        sharing = config.get("sharing") or {}
        for mode in ("timeSlicing", "mps"):
            if mode in sharing and not (sharing[mode] or {}).get("resources"):
                problems.append(f"{name}.sharing.{mode}: no resources specified")  # replicas.go UnmarshalJSON
        if (sharing.get("timeSlicing") or {}).get("resources") and (sharing.get("mps") or {}).get("resources"):
            problems.append(f"{name}.sharing: both timeSlicing and mps")
    return problems


def test_checker_rejects_bad_configs() -> None:
    """The checker is not vacuous: unknown fields, wrong types and bad enums are all reported."""
    good = {"version": "v1", "flags": {"migStrategy": "none", "plugin": {"deviceListStrategy": ["envvar"]}},
            "sharing": {"timeSlicing": {"resources": [
                {"name": "nvidia.com/gpu", "replicas": 4, "devices": [0, "1:0"]}]}}}
    assert config_problems(good, "c") == []
    bad = [
        {"version": "v2"},
        {"flags": {"migStrategy": "some"}},
        {"flags": {"failOnInitError": "true"}},
        {"flags": {"plugin": {"deviceListStrategy": ["nvml"]}}},
        {"flags": {"plugin": {"passDeviceSpecs": 1}}},
        {"flags": {"migstrategy": "none"}},
        {"sharing": {"timeslicing": {}}},
        {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 1}]}}},
        {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu"}]}}},
        {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2, "devices": "some"}]}}},
        {"sharing": {"mps": {"resources": []}}},
        {"sharing": {"mps": {"renameByDefault": "yes", "resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}},
    ]
    for config in bad:
        assert config_problems(config, "c"), config


def _device_plugin_configs(overlay: str) -> dict[str, Any]:
    objs = render(3, overlay).objects()
    cms = find(objs, "ConfigMap", f"{FULLNAME}-device-plugin-configs")
    if not cms:
        pytest.fail(f"{overlay}: ConfigMap {FULLNAME}-device-plugin-configs is not rendered")
    return {name: yaml.safe_load(text) for name, text in cms[0]["data"].items()}


@pytest.mark.parametrize("overlay", overlays())
def test_rendered_device_plugin_configs_match_upstream_schema(overlay: str) -> None:
    if overlay.startswith("policy-only-"):  # another project's device plugin, read live by the webhook
        assert find(render(3, overlay).objects(), "ConfigMap", f"{FULLNAME}-device-plugin-configs") == []
        return
    configs = _device_plugin_configs(overlay)
    assert configs
    problems = [p for name, config in configs.items() for p in config_problems(config, name)]
    assert problems == []
    for config in configs.values():
        assert config["version"] == "v1"
        assert config["flags"]["migStrategy"] in MIG_STRATEGIES
