"""Reading the live GPU configuration the policy follows (`serve --policy-source`, docs/gpu-operator.md):
the GPU Operator's ClusterPolicy and the device plugin ConfigMap it names, or the device-plugin chart's
config ConfigMap. policy/live.py turns what is read into the PolicyConfig; a reader never raises: what
cannot be read becomes the fail-closed policy (GPU010) whose message names it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from gpu_stack_webhook.kube.client import Forbidden, KubeApi, KubeError
from gpu_stack_webhook.policy.config import GpuOperatorIdentity, PolicyConfig, RuntimeClasses
from gpu_stack_webhook.policy.live import (
    SourceError,
    device_plugin_policy,
    operator_policy,
    read_cluster_policy,
    unavailable_policy,
)

T = TypeVar("T")
# PolicyConfig (the chart's policy file) -> the PolicyConfig to judge with.
Reader = Callable[[PolicyConfig], PolicyConfig]


def _get(ask: Callable[[], T], verb: str, what: str) -> T:
    try:
        return ask()
    except Forbidden as exc:
        raise SourceError(f"no permission to {verb} {what} ({exc.message})") from None
    except KubeError as exc:
        raise SourceError(f"cannot {verb} {what}: {exc}") from None


class OperatorReader:
    """The ClusterPolicy `name` and the ConfigMap its devicePlugin.config names, in the operator's
    namespace (its status.namespace, else `namespace`). The operator runs as `service_account` there: who
    it is (policy/operator_owned.py) is known even while its ClusterPolicy cannot be read."""

    def __init__(self, api: KubeApi, name: str, namespace: str, service_account: str = "gpu-operator") -> None:
        self.api, self.name, self.namespace, self.service_account = api, name, namespace, service_account

    def describe(self) -> str:
        return f"GPU Operator ClusterPolicy {self.name}"

    def __call__(self, base: PolicyConfig) -> PolicyConfig:
        base = base.model_copy(update={"gpu_operator": GpuOperatorIdentity(
            namespace=self.namespace, service_account=self.service_account, cluster_policy=self.name)})
        try:
            return self.read(base)
        except SourceError as exc:
            return unavailable_policy(base, str(exc))

    def read(self, base: PolicyConfig) -> PolicyConfig:
        obj: dict[str, Any] | None = _get(lambda: self.api.read_cluster_policy(self.name), "get",
                                          f"clusterpolicies.nvidia.com {self.name}")
        if obj is None:
            raise SourceError(f"ClusterPolicy {self.name} does not exist (is the GPU Operator installed, and "
                              f"is this the name of its ClusterPolicy?)")
        settings = read_cluster_policy(obj)
        settings = replace(settings, namespace=settings.namespace or self.namespace)
        data = None
        if settings.plugin_config:
            data = _get(lambda: self.api.read_configmap_data(settings.namespace, settings.plugin_config), "get",
                        f"configmap {settings.plugin_config} in namespace {settings.namespace}")
        return operator_policy(base, settings, data)


class DevicePluginReader:
    """The device-plugin chart's config ConfigMap `namespace`/`name` and its default config."""

    def __init__(self, api: KubeApi, namespace: str, name: str, default_config: str = "") -> None:
        self.api, self.namespace, self.name, self.default_config = api, namespace, name, default_config

    def describe(self) -> str:
        return f"device plugin ConfigMap {self.namespace}/{self.name}"

    def __call__(self, base: PolicyConfig) -> PolicyConfig:
        where = f"ConfigMap {self.namespace}/{self.name}"
        try:
            data = _get(lambda: self.api.read_configmap_data(self.namespace, self.name), "get",
                        f"configmap {self.name} in namespace {self.namespace}")
            return device_plugin_policy(base, where, data, self.default_config)
        except SourceError as exc:
            return unavailable_policy(base, str(exc))


class RuntimeClassReader:
    """The cluster's RuntimeClasses with their handlers (policy/runtime_classes.py), read after `inner` (the
    policy source's reader, if any). A failed read is kept as the error: pods naming a runtime class that may
    be the NVIDIA runtime are then denied (GPU010), others judged as before."""

    def __init__(self, api: KubeApi, inner: Reader | None = None) -> None:
        self.api, self.inner = api, inner

    def describe(self) -> str:
        what = "the cluster's RuntimeClasses"
        describe = getattr(self.inner, "describe", None)
        return f"{describe()} and {what}" if describe else what

    def __call__(self, base: PolicyConfig) -> PolicyConfig:
        config = self.inner(base) if self.inner is not None else base
        try:
            known = RuntimeClasses(handlers=_get(self.api.list_runtime_classes, "list", "runtimeclasses.node.k8s.io"))
        except SourceError as exc:
            known = RuntimeClasses(error=str(exc))
        return config.model_copy(update={"runtime_classes": known})


def add_source_arguments(parser: Any, own: str, own_help: str) -> None:
    """The options that choose where the sharing configs come from, the same for `serve` and `inspect`:
    `own` names the command's own source (its first choice and default), described by `own_help`."""
    parser.add_argument("--policy-source", choices=[own, "gpu-operator", "device-plugin"], default=own,
                        help=f"{own_help}; gpu-operator: follow the GPU Operator's ClusterPolicy and the device plugin "
                             "ConfigMap it names; device-plugin: follow the device-plugin chart's config ConfigMap "
                             "(default %(default)s)")
    parser.add_argument("--cluster-policy", default="cluster-policy",
                        help="gpu-operator: the ClusterPolicy's name (default %(default)s)")
    parser.add_argument("--operator-namespace", default="gpu-operator",
                        help="gpu-operator: its namespace when the ClusterPolicy's status does not say "
                             "(default %(default)s)")
    parser.add_argument("--operator-service-account", default="gpu-operator",
                        help="gpu-operator: the operator's ServiceAccount, whose DaemonSets and their pods are "
                             "admitted as its own (default %(default)s)")
    parser.add_argument("--plugin-configmap", metavar="NAMESPACE/NAME",
                        help="device-plugin: the chart's config ConfigMap (config.name, or <fullname>-configs)")
    parser.add_argument("--plugin-default-config", default="",
                        help="device-plugin: the chart's config.default (default: `default`, else the only config)")
