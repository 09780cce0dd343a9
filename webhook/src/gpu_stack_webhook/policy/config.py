"""The webhook's policy configuration: one YAML file, mounted by the chart from a ConfigMap.

The `sharing.configs` entries are the NVIDIA device plugin config files (version v1) exactly as the
chart renders them for the device plugin, so the webhook judges pods against what the nodes expose.
Only the fields the policy needs are typed; the rest of a device plugin config is kept and ignored.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpu_stack_webhook.policy.quantity import parse_quantity

MPS_ANNOTATION = "gpu-stack.io/mps"
MPS_TAINT_KEY = "gpu-stack.io/mps"


# The largest AdmissionReview the API server can legitimately send (README "Review size limit"):
# an object etcd accepts is at most 1.5 MiB as stored (etcd --max-request-bytes default); Go's JSON
# encoder writes each of `<`, `>`, `&` (and control characters) as a six-byte \u00XX escape, so that
# object can grow six-fold in the review; an UPDATE carries object and oldObject; 1 MiB more covers
# the envelope (userInfo, options). 2 x 6 x 1.5 MiB + 1 MiB = 19 MiB.
ETCD_MAX_OBJECT_BYTES = 1536 * 1024
GO_JSON_ESCAPE_EXPANSION = 6
REVIEW_ENVELOPE_BYTES = 1024 * 1024
DEFAULT_MAX_REQUEST_BYTES = 2 * GO_JSON_ESCAPE_EXPANSION * ETCD_MAX_OBJECT_BYTES + REVIEW_ENVELOPE_BYTES


class ConfigError(Exception):
    """The policy file is unreadable or invalid; the message names the offending key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class _Lenient(BaseModel):
    """Device plugin config sections: we type what we use and tolerate the rest of upstream's fields."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)


class ReplicatedResource(_Lenient):
    name: str
    rename: str | None = None
    replicas: int = Field(ge=1)
    devices: Any = None


class ReplicatedResources(_Lenient):
    rename_by_default: bool = Field(False, alias="renameByDefault")
    # None: unset, which the device plugin v0.20 reads as true for MPS and false for time-slicing.
    fail_requests_greater_than_one: bool | None = Field(None, alias="failRequestsGreaterThanOne")
    resources: tuple[ReplicatedResource, ...] = ()


class Sharing(_Lenient):
    time_slicing: ReplicatedResources | None = Field(None, alias="timeSlicing")
    mps: ReplicatedResources | None = None

    @model_validator(mode="after")
    def _one_strategy(self) -> Sharing:
        if self.time_slicing and self.time_slicing.resources and self.mps and self.mps.resources:
            raise ValueError("timeSlicing and mps cannot both list resources in one config")
        return self


class PluginFlags(_Lenient):
    # One string or a list (k8s-device-plugin v0.20 api/config/v1/flags.go deviceListStrategyFlag);
    # the plugin's default is envvar.
    device_list_strategy: str | tuple[str, ...] = Field("envvar", alias="deviceListStrategy")

    @property
    def device_list_strategies(self) -> tuple[str, ...]:
        value = self.device_list_strategy
        return (value,) if isinstance(value, str) else value


class DevicePluginFlags(_Lenient):
    mig_strategy: Literal["none", "single", "mixed"] = Field("none", alias="migStrategy")
    plugin: PluginFlags = PluginFlags()


class DevicePluginConfig(_Lenient):
    """One NVIDIA device plugin config file (github.com/NVIDIA/k8s-device-plugin api/config/v1)."""

    version: Literal["v1"] = "v1"
    flags: DevicePluginFlags = DevicePluginFlags()
    sharing: Sharing = Sharing()


class SharingConfigs(_Strict):
    # Node label the device plugin's config-manager reads to choose a named config.
    node_config_label: str = Field("nvidia.com/device-plugin.config", alias="nodeConfigLabel")
    default_config: str = Field("default", alias="defaultConfig")
    configs: dict[str, DevicePluginConfig] = Field(default_factory=lambda: {"default": DevicePluginConfig()})

    @model_validator(mode="after")
    def _default_exists(self) -> SharingConfigs:
        if self.default_config not in self.configs:
            raise ValueError(f"defaultConfig {self.default_config!r} is not one of configs {sorted(self.configs)}")
        return self


class Toleration(_Strict):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(None, alias="tolerationSeconds")

    def as_k8s(self) -> dict[str, Any]:
        return dict(self.k8s)

    @cached_property
    def k8s(self) -> dict[str, Any]:
        """As a pod spec writes it, built once (read-only: as_k8s() for a copy to change)."""
        return self.model_dump(by_alias=True, exclude_none=True)


class MpsPolicy(_Strict):
    # Pods carrying this annotation with value "true" opt in to MPS.
    annotation: str = MPS_ANNOTATION
    # Labels that identify MPS nodes. A pod selecting any of them is an MPS pod; an annotation opt-in
    # gets them injected as its nodeSelector.
    node_selector: dict[str, str] = Field(
        default_factory=lambda: {"nvidia.com/mps.capable": "true"}, alias="nodeSelector"
    )
    tolerations: tuple[Toleration, ...] = (
        Toleration(key=MPS_TAINT_KEY, operator="Exists", effect="NoSchedule"),
    )
    inject_host_ipc: bool = Field(True, alias="injectHostIPC")
    # With API lookups on, an MPS pod in a namespace enforcing Pod Security baseline/restricted (which
    # forbid hostIPC): `deny` it with an explanation, or `skip` adding hostIPC (with a warning).
    pod_security_conflict: Literal["deny", "skip"] = Field("deny", alias="podSecurityConflict")


class GpuResources(_Strict):
    """Which extended resources are GPUs. Besides these, every resource name (and rename) in the
    sharing configs counts, normalised as the device plugin does (sharing.py). Not every `nvidia.com/`
    name is a GPU: the NVIDIA Network Operator advertises RDMA devices as `nvidia.com/rdma_*`,
    `nvidia.com/hostdev` and the like."""

    prefixes: tuple[str, ...] = ("nvidia.com/mig-",)
    names: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/gpu.shared")

    def is_gpu(self, resource: str) -> bool:
        return resource in self.names or resource.startswith(self.prefixes)


class RuleSettings(_Strict):
    disabled: tuple[str, ...] = ()
    # What to do with a MIG resource name no candidate config exposes.
    mig_unexposed: Literal["deny", "warn"] = Field("deny", alias="migUnexposed")


# kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1 deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-*.yaml
DRA_GPU_DEVICE_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com")
# The same tag, api/nvidia.com/resource/v1beta1/sharing.go: GpuSharingStrategy values.
DRA_SHARING_STRATEGIES = ("TimeSlicing", "MPS")


class DraPolicy(_Strict):
    """GPUs from Dynamic Resource Allocation (policy/dra.py, rules GPU002, GPU003, GPU006, GPU009)."""

    # DeviceClasses whose devices are GPUs: a claim request naming one gives GPUs, and so does the
    # extended resource deviceclass.resource.kubernetes.io/<class>.
    gpu_device_classes: tuple[str, ...] = Field(DRA_GPU_DEVICE_CLASSES, alias="gpuDeviceClasses")
    # Namespaces where a claim may ask for allocationMode All on a GPU class (every matching GPU).
    allocation_mode_all_namespaces: tuple[str, ...] = Field((), alias="allocationModeAllNamespaces")
    # Namespaces where a claim may ask for adminAccess on a GPU class (besides the API server's own
    # requirement, the namespace label resource.kubernetes.io/admin-access=true).
    admin_access_namespaces: tuple[str, ...] = Field((), alias="adminAccessNamespaces")
    # GpuConfig / MigDeviceConfig sharing strategies the driver was deployed with (its feature gates
    # TimeSlicingSettings and MPSSupport, both off by default upstream).
    sharing_strategies: tuple[Literal["TimeSlicing", "MPS"], ...] = Field((), alias="sharingStrategies")
    # The MPS memory limit a claim without one gets (sharing.mpsConfig.defaultPinnedDeviceMemoryLimit,
    # a quantity); "" adds none (the claim is then only warned about).
    mps_default_pinned_device_memory_limit: str = Field("", alias="mpsDefaultPinnedDeviceMemoryLimit")
    # A pod with a claim the webhook cannot read (lookups off or failing, claim not found yet) and
    # something a GPU rule would deny if the claim held a GPU: `deny` (fail closed) or `warn`.
    unresolved_claims: Literal["deny", "warn"] = Field("deny", alias="unresolvedClaims")

    @model_validator(mode="after")
    def _limit_is_quantity(self) -> DraPolicy:
        limit = self.mps_default_pinned_device_memory_limit
        if limit:
            try:
                parsed = parse_quantity(limit)
                ok = parsed.is_finite() and parsed > 0
            except (ValueError, ArithmeticError):
                ok = False
            if not ok:
                raise ValueError(f"mpsDefaultPinnedDeviceMemoryLimit {limit!r} is not a positive quantity")
        return self

    def is_gpu_class(self, name: object) -> bool:
        return isinstance(name, str) and name in self.gpu_device_classes


# The runtime handlers that are the NVIDIA container runtime: what nvidia-ctk-installer v1.20.0 registers
# (cmd/nvidia-ctk-installer/container/operator/operator.go GetRuntimes: `nvidia` or the configured name, and
# `nvidia-cdi`, `nvidia-legacy`), and what k3s and RKE2 configure when they find the toolkit
# (`nvidia-experimental` besides those).
NVIDIA_RUNTIME_HANDLERS = ("nvidia", "nvidia-cdi", "nvidia-legacy", "nvidia-experimental")


class RuntimeClasses(_Strict):
    """The cluster's RuntimeClasses as the webhook last read them (kube/live.py RuntimeClassReader): each
    name with its handler, or why they could not be read."""

    handlers: dict[str, str] = {}
    error: str = ""


class GpuOperatorIdentity(_Strict):
    """Who the GPU Operator is, read from its ClusterPolicy (policy/operator_owned.py)."""

    namespace: str
    service_account: str = Field(alias="serviceAccount")
    cluster_policy: str = Field(alias="clusterPolicy")
    cluster_policy_uid: str = Field("", alias="clusterPolicyUid")


class PolicyConfig(_Strict):
    gpu_resources: GpuResources = Field(GpuResources(), alias="gpuResources")
    gpu_runtime_class_names: tuple[str, ...] = Field(("nvidia",), alias="gpuRuntimeClassNames")
    # RuntimeClasses the admin declares are not the NVIDIA runtime (gVisor, Kata): a pod naming one is not a GPU
    # pod for its runtime class, whatever the cluster's read says, so the matchConditions need not send it
    # (policy/runtime_classes.py). The chart keeps the declaration true: its ValidatingAdmissionPolicy refuses a
    # RuntimeClass of one of these names with an NVIDIA handler, and the API server keeps a handler immutable.
    non_gpu_runtime_class_names: tuple[str, ...] = Field((), alias="nonGpuRuntimeClassNames")
    exempt_namespaces: tuple[str, ...] = Field(("gpu-stack", "kube-system"), alias="exemptNamespaces")
    sharing: SharingConfigs = SharingConfigs()
    mps: MpsPolicy = MpsPolicy()
    rules: RuleSettings = RuleSettings()
    # The runtime class the mutating pass gives GPU pods that name none ("" = none): the layout where
    # the NVIDIA runtime is not the node's default runtime (see the chart README, "Runtime layout").
    inject_runtime_class_name: str = Field("", alias="injectRuntimeClassName")
    # Is the NVIDIA runtime the node's default runtime (chart layouts default-runtime and preinstalled)?
    # Then every container on a GPU node runs under it, GPU pod or not, and the env and device-list
    # checks (GPU002, GPU007's mounts) apply to every pod; otherwise only pods that name a GPU resource
    # or a GPU runtime class reach it. True when unset: a webhook that is not told cannot assume less.
    nvidia_runtime_is_default: bool = Field(True, alias="nvidiaRuntimeIsDefault")
    max_request_bytes: int = Field(DEFAULT_MAX_REQUEST_BYTES, alias="maxRequestBytes", ge=1024)
    dra: DraPolicy = DraPolicy()
    # Set by `serve --policy-source` while the live configuration (GPU Operator ClusterPolicy, device
    # plugin ConfigMap) cannot be read: what is missing. GPU pods are then denied with it (GPU010).
    source_error: str = Field("", alias="sourceError")
    # Does the node's NVIDIA toolkit honour NVIDIA_VISIBLE_DEVICES from unprivileged containers
    # (accept-nvidia-visible-devices-envvar-when-unprivileged)? This chart's toolkit does not; the toolkit's
    # own default does, and so does the GPU Operator's (GPU011).
    envvar_when_unprivileged: bool = Field(False, alias="envvarWhenUnprivileged")
    # The runtime handlers that are the NVIDIA runtime: a RuntimeClass with one of them is a GPU runtime class
    # whatever its name (policy/runtime_classes.py).
    nvidia_runtime_handlers: tuple[str, ...] = Field(NVIDIA_RUNTIME_HANDLERS, alias="nvidiaRuntimeHandlers")
    # The cluster's RuntimeClasses, when the webhook follows them (`serve --runtime-classes live`); None:
    # only `gpuRuntimeClassNames` are GPU runtime classes (offline, CEL mode).
    runtime_classes: RuntimeClasses | None = Field(None, alias="runtimeClasses")
    # Does the toolkit run its NRI plugin, which injects the CDI devices a pod's `nvidia.cdi.k8s.io/`
    # annotations name under any runtime? None: not known. Reported (the policy-source log line), never relied
    # on: GPU007 denies those annotations whatever it says (the plugin may be switched on after admission).
    nri_plugin_enabled: bool | None = Field(None, alias="nriPluginEnabled")
    # With `serve --policy-source gpu-operator`: the operator, whose own pods are admitted as its own.
    gpu_operator: GpuOperatorIdentity | None = Field(None, alias="gpuOperator")

    @model_validator(mode="after")
    def _runtime_classes_declared_once(self) -> PolicyConfig:
        gpu = {*self.gpu_runtime_class_names, self.inject_runtime_class_name}
        if both := sorted(gpu.intersection(self.non_gpu_runtime_class_names)):
            raise ValueError(f"RuntimeClass {', '.join(both)} cannot be in nonGpuRuntimeClassNames: "
                             "it is a GPU runtime class (gpuRuntimeClassNames or injectRuntimeClassName)")
        return self


def _location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def parse_config(data: Mapping[str, Any] | None, source: str = "<config>") -> PolicyConfig:
    """Validate a parsed document; errors name the bad key, e.g. `sharing.configs.default.flags.migStrategy`."""
    try:
        return PolicyConfig.model_validate(data or {})
    except ValidationError as exc:
        problems = "; ".join(f"{_location(e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{source}: invalid policy config: {problems}") from None


def load_config(path: str | os.PathLike[str] | None = None) -> PolicyConfig:
    """Read the policy file at `path`; no path means built-in defaults. The rule IDs in `rules.disabled`
    are checked against the rules when a Policy is built (engine.py): the rules import this module."""
    if not path:
        return PolicyConfig()
    try:
        text = Path(path).read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read policy config: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: policy config is not valid YAML: {exc}") from None
    if data is not None and not isinstance(data, Mapping):
        raise ConfigError(f"{path}: policy config must be a mapping, got {type(data).__name__}")
    return parse_config(data, str(path))
