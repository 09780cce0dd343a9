"""GPU009 dra-gpu-claims: ResourceClaims and ResourceClaimTemplates ask for GPUs only as the policy allows.

Scope, exactly (what the CEL twin at the end of this module reproduces): a
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

from gpu_stack_webhook.policy.cel_twin import CelMutation, CelValidation, Message, finding_text, patch_op
from gpu_stack_webhook.policy.config import DRA_SHARING_STRATEGIES
from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.desired import DesiredPod
from gpu_stack_webhook.policy.dra import (
    CONFIG_API_VERSION,
    DRIVER,
    LIMIT_NOT_A_QUANTITY,
    MPS,
    MPS_CONFIG_NOT_AN_OBJECT,
    NOT_AN_OBJECT,
    SHARING_KINDS,
    SHARING_NOT_AN_OBJECT,
    UNKNOWN_STRATEGY,
    WRONG_API_VERSION,
    claim_spec_of,
)
from gpu_stack_webhook.policy.findings import Finding, Severity
from gpu_stack_webhook.policy.pod import PodView
from gpu_stack_webhook.policy.signals import Signal

ID = "GPU009"
NAME = "dra-gpu-claims"
# The rule's row of docs/policy-rules.md (markdown; `make generate` writes the table).
DOC = (
    'ResourceClaims and ResourceClaimTemplates (`resource.k8s.io/v1`, CREATE and UPDATE) whose request '
    '(`exactly`, or any `firstAvailable` alternative) names a GPU DeviceClass: `allocationMode: All` only in '
    '`dra.allocationModeAllNamespaces`, `adminAccess: true` only in `dra.adminAccessNamespaces`, a '
    '`GpuConfig`/`MigDeviceConfig` sharing strategy only when `dra.sharingStrategies` lists it (the message '
    'names `webhook.policy.dra.sharingStrategies`), an NVIDIA opaque config the driver could not read is '
    'denied; an MPS config without `mpsConfig.defaultPinnedDeviceMemoryLimit` gets '
    '`dra.mpsDefaultPinnedDeviceMemoryLimit` at /mutate (warning; no default configured: a warning). See '
    '[dra.md](dra.md#what-the-policy-does-with-dra-pods-and-claims)'
)
SCOPE = (Signal.DRA_OBJECT,)
# What stays webhook-only, and why (rules/__init__.py).
WEBHOOK_ONLY = "the warning for an MPS claim without a memory limit"
FEATURE_GATES = {"TimeSlicing": "TimeSlicingSettings", "MPS": "MPSSupport"}
SHARING_KEY = "webhook.policy.dra.sharingStrategies"
ALL_DEVICES = Message('request "{request}" asks for allocationMode All of DeviceClass {device_class} (every matching '
                      "GPU of a node) in namespace {namespace}; allowed only in the namespaces of policy "
                      "dra.allocationModeAllNamespaces: ask for a count")
ADMIN_ACCESS = Message('request "{request}" asks for adminAccess to DeviceClass {device_class}, which reaches GPUs '
                       "other pods hold, in namespace {namespace}; allowed only in the namespaces of policy "
                       "dra.adminAccessNamespaces")
UNREADABLE = Message(f"opaque config for driver {DRIVER} cannot be read: {{problem}}; the driver would refuse the "
                     "claim when its pod starts")
NOT_ENABLED = Message(f"GPU sharing strategy {{strategy}} is not enabled for the NVIDIA DRA driver; set {SHARING_KEY} "
                      "to include {strategy} (the driver's feature gate {gate}) or remove the sharing config")


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
                ALL_DEVICES(request=request.name, device_class=request.device_class, namespace=namespace),
                f"{request.path}.allocationMode"))
        if request.admin_access and namespace not in dra.admin_access_namespaces:
            findings.append(Finding(
                ID, Severity.DENY,
                ADMIN_ACCESS(request=request.name, device_class=request.device_class, namespace=namespace),
                f"{request.path}.adminAccess"))
    for path, problem in spec.problems:
        findings.append(Finding(ID, Severity.DENY, UNREADABLE(problem=problem), path))
    for sharing in spec.sharing:
        if sharing.strategy not in dra.sharing_strategies:
            findings.append(Finding(
                ID, Severity.DENY,
                NOT_ENABLED(strategy=sharing.strategy, gate=FEATURE_GATES[sharing.strategy]),
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


# --- The CEL twin ----------------------------------------------------------------------------------------
# The ResourceClaimSpec (policy.dra.claim_spec_of) and where it sits.
_CLAIM_SPEC = "object.kind == 'ResourceClaimTemplate' ? object.spec.?spec.orValue({}) : object.?spec.orValue({})"
_SPEC_PATH = "object.kind == 'ResourceClaimTemplate' ? 'spec.spec' : 'spec'"
# Every request and firstAvailable alternative (dra.ClaimSpec.requests): {n: request name, s: its spec, p: path}.
_REQUESTS = (
    "cel.bind(rs, variables.claimSpec.?devices.?requests.orValue([]), lists.range(size(rs)).map(i, cel.bind(q, rs[i], "
    "cel.bind(at, variables.specPath + '.devices.requests[' + string(i) + ']', "
    "(has(q.exactly) && type(q.exactly) == map ? [{'n': dyn(q.?name.orValue('')), 's': dyn(q.exactly), "
    "'p': dyn(at + '.exactly')}] : []) + "
    "lists.range(size(q.?firstAvailable.orValue([]))).map(j, {'n': dyn(q.?name.orValue('')), "
    "'s': dyn(type(q.firstAvailable[j]) == map ? q.firstAvailable[j] : {}), "
    "'p': dyn(at + '.firstAvailable[' + string(j) + ']')})))).flatten())"
)
# The NVIDIA driver's opaque config entries: {o: parameters (null when absent), p: path of the parameters}.
_CONFIGS = (
    "cel.bind(cs, variables.claimSpec.?devices.?config.orValue([]), lists.range(size(cs))"
    f".filter(i, cs[i].?opaque.?driver.orValue('') == '{DRIVER}').map(i, "
    "{'o': dyn(cs[i].opaque.?parameters.orValue(null)), "
    "'p': dyn(variables.specPath + '.devices.config[' + string(i) + '].opaque.parameters')}))"
)
_GPU_REQUEST = "r.s.?deviceClassName.orValue('') in variables.draGpuClasses"
_REQUEST_TEXTS = (
    "variables.deviceRequests.filter(r, " + _GPU_REQUEST + ").map(r, "
    "(r.s.?allocationMode.orValue('') == 'All' && !(variables.claimNamespace in "
    "variables.draAllocationModeAllNamespaces) ? ["
    + finding_text(ID, ALL_DEVICES.cel(request="r.n", device_class="string(r.s.deviceClassName)",
                                       namespace="variables.claimNamespace"), "r.p + '.allocationMode'")
    + "] : []) + (r.s.?adminAccess.orValue(false) == true && !(variables.claimNamespace in "
    "variables.draAdminAccessNamespaces) ? ["
    + finding_text(ID, ADMIN_ACCESS.cel(request="r.n", device_class="string(r.s.deviceClassName)",
                                        namespace="variables.claimNamespace"), "r.p + '.adminAccess'")
    + "] : [])).flatten()"
)
_KINDS = list(SHARING_KINDS)
_STRATEGIES = list(DRA_SHARING_STRATEGIES)
# [path, problem] of an NVIDIA opaque config the driver could not read (policy.dra ClaimSpec._read_config), or [].
_PROBLEM = (
    f"type(c.o) != map ? [dyn(c.p), dyn('{NOT_AN_OBJECT}')] : "
    f"c.o.?apiVersion.orValue(null) != '{CONFIG_API_VERSION}' ? [dyn(c.p + '.apiVersion'), "
    f"dyn('{WRONG_API_VERSION}')] : "
    f"!(c.o.?kind.orValue(null) in {_KINDS!r}) || c.o.?sharing.orValue(null) == null ? [] : "
    f"type(c.o.sharing) != map ? [dyn(c.p + '.sharing'), dyn('{SHARING_NOT_AN_OBJECT}')] : "
    f"!(c.o.sharing.?strategy.orValue(null) in {_STRATEGIES!r}) ? [dyn(c.p + '.sharing.strategy'), "
    f"dyn('{UNKNOWN_STRATEGY}')] : "
    "c.o.sharing.?mpsConfig.orValue(null) != null && type(c.o.sharing.mpsConfig) != map ? "
    f"[dyn(c.p + '.sharing.mpsConfig'), dyn('{MPS_CONFIG_NOT_AN_OBJECT}')] : "
    "cel.bind(l, c.o.sharing.?mpsConfig.orValue(null) == null ? null : "
    "c.o.sharing.mpsConfig.?defaultPinnedDeviceMemoryLimit.orValue(null), l != null && !("
    "type(l) == string ? isQuantity(l) : type(l) == int)) ? "
    "[dyn(c.p + '.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit'), "
    f"dyn('{LIMIT_NOT_A_QUANTITY}')] : []"
)
_PROBLEM_TEXTS = (
    f"variables.nvidiaConfigs.map(c, cel.bind(x, {_PROBLEM}, size(x) == 0 ? [] : ["
    + finding_text(ID, UNREADABLE.cel(problem="x[1]"), "x[0]")
    + "])).flatten()"
)
_GATES = "{" + ", ".join(f"'{k}': '{v}'" for k, v in FEATURE_GATES.items()) + "}"
_SHARING_TEXTS = (
    f"variables.nvidiaConfigs.filter(c, size({_PROBLEM}) == 0 && type(c.o) == map && "
    f"c.o.?kind.orValue(null) in {_KINDS!r} && c.o.?sharing.orValue(null) != null && "
    "!(c.o.sharing.strategy in variables.draSharingStrategies)).map(c, "
    + finding_text(ID, NOT_ENABLED.cel(strategy="c.o.sharing.strategy", gate=f"{_GATES}[c.o.sharing.strategy]"),
                   "c.p + '.sharing.strategy'")
    + ")"
)
CEL_VALIDATION = CelValidation(ID, NAME, (
    "draGpuClasses", "draAllocationModeAllNamespaces", "draAdminAccessNamespaces", "draSharingStrategies"), (
    ("claimSpec", _CLAIM_SPEC), ("specPath", _SPEC_PATH),
    ("claimNamespace", "object.?metadata.?namespace.orValue('')"),
    ("deviceRequests", _REQUESTS), ("nvidiaConfigs", _CONFIGS),
    ("violations", f"{_REQUEST_TEXTS} + {_PROBLEM_TEXTS} + {_SHARING_TEXTS}"),
), target="dra")

# The claim variables above; an entry gets the limit when the driver could read it (no problem),
# its strategy is MPS and enabled, and it sets no limit (check_object).
_LIMIT_WANTED = (
    f"size({_PROBLEM}) == 0 && type(c.o) == map && c.o.?kind.orValue(null) in {_KINDS!r} && "
    f"c.o.?sharing.orValue(null) != null && c.o.sharing.strategy == '{MPS}' && "
    f"'{MPS}' in variables.draSharingStrategies && "
    # mpsConfig null (the driver reads it as absent): CEL selects no field of null, so test its type first.
    "(type(c.o.sharing.?mpsConfig.orValue(null)) != map || "
    "c.o.sharing.mpsConfig.?defaultPinnedDeviceMemoryLimit.orValue(null) == null)"
)
_POINTER = "'/' + c.p.replace('.', '/').replace('[', '/').replace(']', '') + '/sharing/mpsConfig'"
_LIMIT_PATCH = (
    "variables.draMpsDefaultLimit == '' ? [] : "
    f"variables.nvidiaConfigs.filter(c, {_LIMIT_WANTED}).map(c, "
    "type(c.o.sharing.?mpsConfig.orValue(null)) == map ? "
    f"{patch_op(_POINTER + ' + ' + repr('/defaultPinnedDeviceMemoryLimit'), 'variables.draMpsDefaultLimit')} : "
    f"{patch_op(_POINTER, '{' + repr('defaultPinnedDeviceMemoryLimit') + ': variables.draMpsDefaultLimit}')})"
)
CEL_MUTATION = CelMutation(
    ID, NAME, ("draSharingStrategies", "draMpsDefaultLimit"),
    tuple((n, e) for n, e in CEL_VALIDATION.variables if n != "violations"),
    _LIMIT_PATCH, target="dra",
)
