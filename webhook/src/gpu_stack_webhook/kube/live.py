"""Reading the live GPU configuration the policy follows (`serve --policy-source`, docs/gpu-operator.md):
the GPU Operator's ClusterPolicy and the device plugin ConfigMap it names, or the device-plugin chart's
config ConfigMap. policy/live.py turns what is read into the PolicyConfig; a reader never raises: what
cannot be read becomes the fail-closed policy (GPU010) whose message names it.

A read the API server does not answer (no permission, unreachable, a timeout: ReadError) is not a refusal:
the last answer to the same get or list is used instead for `keep` seconds after it was read (LastGood), so
a short outage of the API server does not deny the cluster's GPU and sandboxed pods; past that the policy
fails closed. What the API server answers and the policy refuses (a ClusterPolicy of the wrong version, a
missing ConfigMap, an API it does not serve: the ClusterPolicy CRD not installed) fails closed at once. Each
reader tells when its source was last read in full (`last_reads`, the metric
gpu_stack_policy_source_last_read_timestamp_seconds, server/metrics.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from gpu_stack_webhook.kube.client import Forbidden, KubeApi, KubeError, NotServed
from gpu_stack_webhook.policy.config import GpuOperatorIdentity, PolicyConfig, RuntimeClasses
from gpu_stack_webhook.policy.live import (
    device_plugin_policy,
    operator_policy,
    read_cluster_policy,
    unavailable_policy,
)
from gpu_stack_webhook.policy.plugin_inputs import SourceError

log = logging.getLogger("gpu_stack_webhook.kube.live")
T = TypeVar("T")
# PolicyConfig (the chart's policy file) -> the PolicyConfig to judge with.
Reader = Callable[[PolicyConfig], PolicyConfig]
# How long the last good read is used after reads fail (serve --policy-source-keep, chart
# webhook.policySource.keepLastGoodRead): five reads at the default interval.
DEFAULT_KEEP = 10.0


class ReadError(SourceError):
    """The API server did not answer a read (no permission, unreachable, a timeout)."""


def _get(ask: Callable[[], T], verb: str, what: str) -> T:
    try:
        return ask()
    except NotServed as exc:  # answered: no such API here (a CRD not installed); fails closed at once, not kept
        raise SourceError(f"{what} cannot be read: {exc.message}") from None
    except Forbidden as exc:
        raise ReadError(f"no permission to {verb} {what} ({exc.message})") from None
    except KubeError as exc:
        raise ReadError(f"cannot {verb} {what}: {exc}") from None


class LastGood:
    """The reads of one source (`name`, the metric's label), each answer kept `keep` seconds: a read that
    fails (ReadError) within that time of the last answer to the same read gets that answer, logged once per
    outage; later it raises, naming how old the last answer is. `last_read` is the wall-clock time at which
    every read of the source was last answered (0: never)."""

    def __init__(self, name: str, keep: float = DEFAULT_KEEP, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.name, self.keep, self.clock, self.wall = name, keep, clock, wall
        self._answers: dict[str, tuple[Any, float]] = {}
        self._failing = False
        self._all_answered = True
        self.last_read = 0.0

    def begin(self) -> None:
        """Before the reads of one pass."""
        self._all_answered = True

    def end(self) -> None:
        """After the reads of one pass (whether the policy took them or not)."""
        if self._all_answered:
            self.last_read = self.wall()
            if self._failing:
                self._failing = False
                log.warning("%s read again", self.name, extra={"event": "policy-source-read-again",
                                                              "source": self.name})

    def get(self, ask: Callable[[], T], verb: str, what: str) -> T:
        try:
            value = _get(ask, verb, what)
        except ReadError as exc:
            self._all_answered = False
            kept = self._answers.get(f"{verb} {what}")
            age = None if kept is None else self.clock() - kept[1]
            if kept is None or age is None or age > self.keep:
                if kept is not None:
                    raise ReadError(f"{exc} (the last answer, {age:.0f}s old, is kept {self.keep:g}s)") from None
                raise
            if not self._failing:
                self._failing = True
                log.warning("%s cannot be read; the last good read is used for %gs after it was made", self.name,
                            self.keep, extra={"event": "policy-source-read-kept", "source": self.name,
                                              "error": str(exc), "age": round(age, 3)})
            return kept[0]  # type: ignore[no-any-return]
        self._answers[f"{verb} {what}"] = (value, self.clock())
        return value


class OperatorReader:
    """The ClusterPolicy `name` and the ConfigMap its devicePlugin.config names, in the operator's
    namespace (its status.namespace, else `namespace`). The operator runs as `service_account` there: who
    it is (policy/operator_owned.py) is known even while its ClusterPolicy cannot be read."""

    def __init__(self, api: KubeApi, name: str, namespace: str, service_account: str = "gpu-operator",
                 kept: LastGood | None = None) -> None:
        self.api, self.name, self.namespace, self.service_account = api, name, namespace, service_account
        self.kept = kept if kept is not None else LastGood("gpu-operator")

    def describe(self) -> str:
        return f"GPU Operator ClusterPolicy {self.name}"

    def last_reads(self) -> dict[str, float]:
        return {self.kept.name: self.kept.last_read}

    def __call__(self, base: PolicyConfig) -> PolicyConfig:
        base = base.model_copy(update={"gpu_operator": GpuOperatorIdentity(
            namespace=self.namespace, service_account=self.service_account, cluster_policy=self.name)})
        self.kept.begin()
        try:
            return self.read(base)
        except SourceError as exc:
            return unavailable_policy(base, str(exc))
        finally:
            self.kept.end()

    def read(self, base: PolicyConfig) -> PolicyConfig:
        obj: dict[str, Any] | None = self.kept.get(lambda: self.api.read_cluster_policy(self.name), "get",
                                                   f"clusterpolicies.nvidia.com {self.name}")
        if obj is None:
            raise SourceError(f"ClusterPolicy {self.name} does not exist (is the GPU Operator installed, and "
                              f"is this the name of its ClusterPolicy?)")
        settings = read_cluster_policy(obj)
        settings = replace(settings, namespace=settings.namespace or self.namespace)
        data = None
        if settings.plugin_config:
            data = self.kept.get(lambda: self.api.read_configmap_data(settings.namespace, settings.plugin_config),
                                 "get", f"configmap {settings.plugin_config} in namespace {settings.namespace}")
        return operator_policy(base, settings, data)


class DevicePluginReader:
    """The device-plugin chart's config ConfigMap `namespace`/`name` and its default config."""

    def __init__(self, api: KubeApi, namespace: str, name: str, default_config: str = "",
                 kept: LastGood | None = None) -> None:
        self.api, self.namespace, self.name, self.default_config = api, namespace, name, default_config
        self.kept = kept if kept is not None else LastGood("device-plugin")

    def describe(self) -> str:
        return f"device plugin ConfigMap {self.namespace}/{self.name}"

    def last_reads(self) -> dict[str, float]:
        return {self.kept.name: self.kept.last_read}

    def __call__(self, base: PolicyConfig) -> PolicyConfig:
        where = f"ConfigMap {self.namespace}/{self.name}"
        self.kept.begin()
        try:
            data = self.kept.get(lambda: self.api.read_configmap_data(self.namespace, self.name), "get",
                                 f"configmap {self.name} in namespace {self.namespace}")
            return device_plugin_policy(base, where, data, self.default_config)
        except SourceError as exc:
            return unavailable_policy(base, str(exc))
        finally:
            self.kept.end()


class RuntimeClassReader:
    """The cluster's RuntimeClasses with their handlers (policy/runtime_classes.py), read after `inner` (the
    policy source's reader, if any). A failed list past the kept one (LastGood) is kept as the error: pods
    naming a runtime class that may be the NVIDIA runtime are then denied (GPU010), others judged as before.
    A RuntimeClass without a handler (the API server requires one) is logged, and its pods denied (GPU010).
    So is one the admin declares non-GPU (`nonGpuRuntimeClassNames`) whose handler is the NVIDIA runtime: the
    API server does not send its pods, so the log is all the webhook can do."""

    def __init__(self, api: KubeApi, inner: Reader | None = None, kept: LastGood | None = None) -> None:
        self.api, self.inner = api, inner
        self.kept = kept if kept is not None else LastGood("runtime-classes")
        self._without_handler: tuple[str, ...] = ()
        self._declared_nvidia: tuple[str, ...] = ()

    def last_reads(self) -> dict[str, float]:
        inner = getattr(self.inner, "last_reads", None)
        return {**(inner() if inner is not None else {}), self.kept.name: self.kept.last_read}

    def describe(self) -> str:
        what = "the cluster's RuntimeClasses"
        describe = getattr(self.inner, "describe", None)
        return f"{describe()} and {what}" if describe else what

    def __call__(self, base: PolicyConfig) -> PolicyConfig:
        config = self.inner(base) if self.inner is not None else base
        self.kept.begin()
        try:
            known = RuntimeClasses(handlers=self.kept.get(self.api.list_runtime_classes, "list",
                                                          "runtimeclasses.node.k8s.io"))
        except SourceError as exc:
            known = RuntimeClasses(error=str(exc))
        finally:
            self.kept.end()
        without = tuple(sorted(name for name, handler in known.handlers.items() if not handler))
        if without != self._without_handler:
            self._without_handler = without
            if without:
                log.error("RuntimeClasses without a handler: their pods are denied (GPU010)",
                          extra={"event": "runtime-class-without-handler", "runtimeClasses": list(without)})
        declared_nvidia = tuple(sorted(name for name in config.non_gpu_runtime_class_names
                                       if known.handlers.get(name) in config.nvidia_runtime_handlers))
        if declared_nvidia != self._declared_nvidia:
            self._declared_nvidia = declared_nvidia
            if declared_nvidia:
                log.error("RuntimeClasses declared non-GPU (nonGpuRuntimeClassNames) have an NVIDIA runtime handler: "
                          "the API server does not send their pods to the webhook; delete them or remove them from "
                          "nonGpuRuntimeClassNames", extra={"event": "runtime-class-declared-non-gpu-is-nvidia",
                                                            "runtimeClasses": list(declared_nvidia)})
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
