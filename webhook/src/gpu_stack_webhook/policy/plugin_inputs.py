"""The device plugin's own inputs as the GPU Operator or the device-plugin chart hand them over: its command-line
flags and its named config files (policy/live.py completes the policy from them). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml


class SourceError(Exception):
    """The live configuration cannot be used; the message names what is missing or refused."""


# The device plugin's flags (k8s-device-plugin v0.20.0 cmd/nvidia-device-plugin/main.go) the policy reads; on
# its command line (ClusterPolicy devicePlugin.args, gpu-operator v26.7.0 TransformDevicePlugin) a flag
# outranks its environment variable (urfave/cli: EnvVars are read only for flags not given).
READ_FLAGS = ("mig-strategy", "device-list-strategy")
# A flag that would make the plugin read what the policy does not.
REFUSED_FLAGS = ("config-file",)


def plugin_flags(args: Any) -> dict[str, str]:
    """The values of READ_FLAGS in the device plugin's arguments (`--name=value`, `--name value`, one dash
    or two); a repeated string-slice flag (device-list-strategy) accumulates, comma-joined."""
    if args is None:
        return {}
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise SourceError("spec.devicePlugin.args is not a list of strings")
    found: dict[str, list[str]] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        name, has_value, value = arg.lstrip("-").partition("=")
        if not arg.startswith("-") or name not in READ_FLAGS + REFUSED_FLAGS:
            continue
        if not has_value:
            if index >= len(args):
                raise SourceError(f"spec.devicePlugin.args: {arg} has no value")
            value = args[index]
            index += 1
        if name in REFUSED_FLAGS:
            raise SourceError(f"spec.devicePlugin.args sets --{name}: the device plugin would then read a "
                              f"config the policy cannot follow")
        found.setdefault(name, []).append(value)
    return {name: values[-1] if name == "mig-strategy" else ",".join(values) for name, values in found.items()}


def plugin_config_files(data: Mapping[str, str], where: str) -> dict[str, dict[str, Any]]:
    """The named device plugin config files of a ConfigMap's data, parsed (not yet validated)."""
    if not data:
        raise SourceError(f"{where} holds no device plugin config")
    configs: dict[str, dict[str, Any]] = {}
    for key, text in sorted(data.items()):
        try:
            parsed = yaml.safe_load(text) if text.strip() else {}
        except yaml.YAMLError as exc:
            raise SourceError(f"{where} key {key}: not valid YAML: {exc}") from None
        if not isinstance(parsed, dict):
            raise SourceError(f"{where} key {key}: a device plugin config must be a mapping")
        configs[key] = parsed
    return configs
