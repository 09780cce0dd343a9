"""GPU009 dra-gpu-claims: ResourceClaims and ResourceClaimTemplates ask for GPUs only as the policy allows.

Scope, exactly (what the CEL port reproduces, cel/validating.py and cel/mutating.py): a
resource.k8s.io/v1 ResourceClaim (`spec`) or ResourceClaimTemplate (`spec.spec`), CREATE and UPDATE,
in a namespace the webhook covers. A GPU request is a `spec.devices.requests[]` entry whose `exactly`,
or any alternative of whose `firstAvailable`, names a DeviceClass of policy `dra.gpuDeviceClasses`.

* A GPU request with `allocationMode: All` (every matching GPU of a node, present and future) is
  denied outside policy `dra.allocationModeAllNamespaces`.
* A GPU request with `adminAccess: true` (access to GPUs that other pods hold; the API server also
  wants the namespace label resource.kubernetes.io/admin-access=true) is denied outside policy
  `dra.adminAccessNamespaces`.
* An opaque config for driver gpu.nvidia.com (`GpuConfig` or `MigDeviceConfig`, apiVersion
  resource.nvidia.com/v1beta1) whose `sharing.strategy` is not in policy `dra.sharingStrategies` (the
  values key `webhook.policy.dra.sharingStrategies`; the driver needs its TimeSlicingSettings /
  MPSSupport feature gate for them) is denied; so is one the driver could not read (parameters not an
  object, another apiVersion, an unknown strategy, a memory limit that is not a quantity).
* An `MPS` sharing config without `mpsConfig.defaultPinnedDeviceMemoryLimit`: at /mutate on CREATE
  the policy's `dra.mpsDefaultPinnedDeviceMemoryLimit` is set (a warning says so), so every MPS client
  has a bounded slice of GPU memory; with no default configured (or on /validate) a warning.

A pod is never judged here: `check` returns nothing; the engine calls `check_object` for the DRA kinds.
"""

from __future__ import annotations

from typing import Any

from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.desired import DesiredPod
from gpu_stack_webhook.policy.dra import MPS, claim_spec_of
from gpu_stack_webhook.policy.findings import Finding, Severity
from gpu_stack_webhook.policy.pod import PodView
from gpu_stack_webhook.policy.signals import Signal

ID = "GPU009"
NAME = "dra-gpu-claims"
SCOPE = (Signal.DRA_OBJECT,)
FEATURE_GATES = {"TimeSlicing": "TimeSlicingSettings", "MPS": "MPSSupport"}
SHARING_KEY = "webhook.policy.dra.sharingStrategies"


def check(pod: PodView, ctx: Context) -> list[Finding]:
    return []


def pointer(path: str) -> str:
    """spec.devices.config[0].opaque -> /spec/devices/config/0/opaque"""
    return "/" + path.replace("[", ".").replace("]", "").replace(".", "/")


def check_object(obj: dict[str, Any], kind: str, desired: DesiredPod, ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    dra = ctx.config.dra
    spec = claim_spec_of(obj, kind)
    namespace = ctx.namespace or str((obj.get("metadata") or {}).get("namespace") or "")
    for request in spec.gpu_requests(dra):
        if request.all_devices and namespace not in dra.allocation_mode_all_namespaces:
            findings.append(Finding(
                ID, Severity.DENY,
                f'request "{request.name}" asks for allocationMode All of DeviceClass {request.device_class} '
                f"(every matching GPU of a node) in namespace {namespace}; allowed only in the namespaces of "
                f"policy dra.allocationModeAllNamespaces: ask for a count",
                f"{request.path}.allocationMode"))
        if request.admin_access and namespace not in dra.admin_access_namespaces:
            findings.append(Finding(
                ID, Severity.DENY,
                f'request "{request.name}" asks for adminAccess to DeviceClass {request.device_class}, which '
                f"reaches GPUs other pods hold, in namespace {namespace}; allowed only in the namespaces of "
                f"policy dra.adminAccessNamespaces",
                f"{request.path}.adminAccess"))
    for path, problem in spec.problems:
        findings.append(Finding(
            ID, Severity.DENY,
            f"opaque config for driver gpu.nvidia.com cannot be read: {problem}; the driver would refuse "
            f"the claim when its pod starts", path))
    for sharing in spec.sharing:
        if sharing.strategy not in dra.sharing_strategies:
            findings.append(Finding(
                ID, Severity.DENY,
                f"GPU sharing strategy {sharing.strategy} is not enabled for the NVIDIA DRA driver; set "
                f"{SHARING_KEY} to include {sharing.strategy} (the driver's feature gate "
                f"{FEATURE_GATES[sharing.strategy]}) or remove the sharing config",
                f"{sharing.path}.sharing.strategy"))
        elif sharing.strategy == MPS and not sharing.has_memory_limit:
            findings.append(_memory_limit(sharing.path, desired, ctx))
    return findings


def _memory_limit(path: str, desired: DesiredPod, ctx: Context) -> Finding:
    limit = ctx.config.dra.mps_default_pinned_device_memory_limit
    at = f"{path}.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"
    if not (limit and ctx.can_patch):
        # What first: kubectl shows warnings cut to 120 characters.
        return Finding(ID, Severity.WARN,
                       "MPS claim has no mpsConfig.defaultPinnedDeviceMemoryLimit: a client may pin all GPU memory",
                       at)
    sharing = desired.edit(pointer(path) + "/sharing")
    if isinstance(sharing.get("mpsConfig"), dict):
        desired.edit(pointer(path) + "/sharing/mpsConfig")["defaultPinnedDeviceMemoryLimit"] = limit
    else:
        sharing["mpsConfig"] = {"defaultPinnedDeviceMemoryLimit": limit}
    return Finding(ID, Severity.WARN,
                   f"MPS claim: set mpsConfig.defaultPinnedDeviceMemoryLimit={limit} (policy default)",
                   at, changed=True)
