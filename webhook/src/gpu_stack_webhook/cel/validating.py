"""One ValidatingAdmissionPolicy per rule that CEL can express: GPU001, GPU002, GPU003, GPU007, GPU009.

Each policy computes `variables.violations`, the list of the texts the Python rule's denials have
(Finding.text: "GPU002 container \"main\" sets ... (spec.containers[0].env[0])"), and denies when it is
not empty, with the message engine.denial_message would build. The scope of each expression is the
Python rule's, documented in the rule's module; tests/property/test_cel_equivalence.py runs both on
generated pods and compares the texts.

What stays in the webhook: warnings (GPU002's unprefixed envFrom, GPU009's MPS claim without a memory
limit), the API lookups (ConfigMap keys, Pod Security levels, the ResourceClaims a pod names: CEL sees a
pod's DRA GPUs only as deviceclass.resource.kubernetes.io/<GPU class> resources), GPU004/GPU005 (per-node
sharing and MIG exposure) and GPU006's denials. GPU009 judges ResourceClaims and ResourceClaimTemplates
(target "dra"), every other policy Pods and workloads (target "pods").
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_stack_webhook.cel.library import (
    ALLOCATED,
    CANDIDATES,
    DRA_HELD,
    DRA_NAMES,
    FRACTION,
    GPU_AMOUNTS,
    Variable,
    quantity_ok,
)
from gpu_stack_webhook.policy import dra
from gpu_stack_webhook.policy.config import DRA_SHARING_STRATEGIES
from gpu_stack_webhook.policy.rules import device_bypass, dra_claims, gpu_limits, privileged, visible_devices


@dataclass(frozen=True)
class CelValidation:
    rule_id: str
    name: str
    # Config variables (library.config_values keys) the expressions read; the chart renders them first.
    config: tuple[str, ...]
    variables: tuple[Variable, ...]  # the last one is `violations`
    # What it matches: "pods" (Pods and workloads: the pod variables come first) or "dra" (ResourceClaims
    # and ResourceClaimTemplates).
    target: str = "pods"


def _text(rule_id: str, message: str, path: str) -> str:
    """CEL for Finding.text: '<ID> <message> (<path>)' (message and path are CEL string expressions)."""
    return f"'{rule_id} ' + {message} + ' (' + {path} + ')'"


# --- GPU002 ----------------------------------------------------------------------------------------------
_VAR = visible_devices.VARIABLE
_ENV = (
    "variables.containers.map(e, lists.range(size(e.c.?env.orValue([])))"
    f".filter(j, e.c.env[j].name == '{_VAR}').map(j, "
    + _text("GPU002", f"e.label + ' sets {_VAR} ' + (has(e.c.env[j].valueFrom) ? 'from valueFrom' : 'explicitly')"
            " + '; ' + variables.visibleDevicesHint",
            "e.path + '.env[' + string(j) + ']'")
    + ")).flatten()"
)
_SOURCE = ("(has(f.configMapRef) ? 'ConfigMap \"' + f.configMapRef.?name.orValue('') + '\"' : "
           "has(f.secretRef) ? 'Secret \"' + f.secretRef.?name.orValue('') + '\"' : 'a source')")
_ENV_FROM = (
    "variables.containers.map(e, lists.range(size(e.c.?envFrom.orValue([]))).map(j, [dyn(j), dyn(e.c.envFrom[j])])"
    f".filter(p, p[1].?prefix.orValue('') != '' && '{_VAR}'.startsWith(p[1].prefix)).map(p, cel.bind(f, p[1], "
    + _text("GPU002", f"e.label + ' imports ' + {_SOURCE} + ' with prefix \"' + f.prefix + '\", which can produce "
            f"{_VAR}; use a prefix that is not the start of {_VAR}'",
            "e.path + '.envFrom[' + string(p[0]) + ']'")
    + "))).flatten()"
)
# Pods that run under the NVIDIA runtime (policy.signals.reaches_nvidia_runtime): GPU pods, or every pod where
# it is the node's default runtime.
_GPU_POD = ("(variables.podSpec.?runtimeClassName.orValue('') in variables.gpuRuntimeClassNames || "
            "size(variables.gpuAmounts) > 0)")
# A pod holding GPUs by DRA that CEL can see: a deviceclass.resource.kubernetes.io/<GPU class> resource.
_NVIDIA_RUNTIME = f"(variables.nvidiaRuntimeIsDefault || {_GPU_POD} || size(variables.draHeld) > 0)"
_RUNTIME_CONFIG = ("gpuNames", "gpuPrefixes", "gpuRuntimeClassNames", "nvidiaRuntimeIsDefault", "draGpuClasses")
_HINT = (f"!{_GPU_POD} && size(variables.draHeld) > 0 ? \"GPUs come from the pod's \" + variables.draNames + "
         "', not from this variable: remove it' : 'GPUs are assigned by the device plugin, request nvidia.com/gpu "
         "instead'")
GPU002 = CelValidation(visible_devices.ID, visible_devices.NAME, _RUNTIME_CONFIG, (
    GPU_AMOUNTS, DRA_HELD, DRA_NAMES, ("visibleDevicesHint", _HINT),
    ("violations", f"{_NVIDIA_RUNTIME} ? {_ENV} + {_ENV_FROM} : []"),
))

# --- GPU007 ----------------------------------------------------------------------------------------------
_CDI = (
    f"variables.annotations.filter(k, k.startsWith('{device_bypass.CDI_ANNOTATION_PREFIX}')).map(k, "
    + _text("GPU007", "'annotation \"' + k + '\" requests CDI devices directly; request nvidia.com/gpu instead'",
            "variables.metaPath + '.annotations[' + k + ']'")
    + ")"
)
# posixpath.normpath, lexically like the toolkit's filepath.Clean: the path's segments without '' and
# '.', each '..' pops one (never above the root). Stack depth after segment i is the running sum of
# +1/-1 minus its lowest point below zero; the cleaned path's k-th component is the last name pushed
# to depth k+1. The path is under the device list dir when its first three components are var, run
# and a name starting with nvidia-container-devices (a plain string prefix, as the toolkit matches).
_DEPTHS = ("cel.bind(d, lists.range(size(s)).map(i, lists.range(i + 1).map(j, s[j] == '..' ? -1 : 1).sum()), "
           "lists.range(size(s)).map(i, cel.bind(low, lists.range(i + 1).map(j, d[j]).min(), "
           "d[i] - (low < 0 ? low : 0))))")


def _component(k: int) -> str:
    return f"lists.range(size(s)).filter(i, s[i] != '..' && depth[i] == {k + 1})"


_DIR_PARTS = device_bypass.DEVICE_LIST_DIR.strip("/").split("/")  # var, run, nvidia-container-devices
_UNDER_DEVICE_DIR = (
    "cel.bind(s, m.mountPath.split('/').filter(x, x != '' && x != '.'), "
    f"cel.bind(depth, {_DEPTHS}, size(s) > 0 && depth[size(s) - 1] >= 3 && "
    + " && ".join(
        f"cel.bind(at, {_component(k)}, s[at[size(at) - 1]]"
        + (f" == '{part}')" if k < 2 else f".startsWith('{part}'))")
        for k, part in enumerate(_DIR_PARTS))
    + "))"
)
_MOUNTS = (
    "variables.containers.map(e, lists.range(size(e.c.?volumeMounts.orValue([])))"
    ".map(j, [dyn(j), dyn(e.c.volumeMounts[j])])"
    f".filter(p, cel.bind(m, p[1], has(m.mountPath) && {_UNDER_DEVICE_DIR})).map(p, "
    + _text("GPU007", "e.label + ' mounts ' + p[1].mountPath + ', which the NVIDIA runtime reads as a GPU device "
            "list; mount it elsewhere'", "e.path + '.volumeMounts[' + string(p[0]) + ']'")
    + ")).flatten()"
)
GPU007 = CelValidation(device_bypass.ID, device_bypass.NAME, _RUNTIME_CONFIG, (
    GPU_AMOUNTS, DRA_HELD, ("violations", f"{_CDI} + ({_NVIDIA_RUNTIME} ? {_MOUNTS} : [])"),
))

# --- GPU003 ----------------------------------------------------------------------------------------------
_PRIVILEGED = "e.c.?securityContext.?privileged.orValue(false) == true"
_GRANTING = sorted(privileged.SYS_ADMIN_GRANTING)
# The index of the first capabilities.add entry that grants CAP_SYS_ADMIN (privileged.canonical_capability).
_SYS_ADMIN_AT = (
    "cel.bind(add, e.c.?securityContext.?capabilities.?add.orValue([]), lists.range(size(add)).filter(k, "
    "cel.bind(u, string(add[k]).trim().upperAscii(), (u.startsWith('CAP_') ? u.substring(4) : u) in "
    f"{_GRANTING!r})))"
)
_OWN_GPU = ("variables.draHeld.exists(h, h.path == e.path) || "
            "variables.candidateConfigs.all(n, n in variables.overridingConfigs) && e.path in variables.allocatedPaths")
# rules.privileged: "a GPU pod", or the DRA resources the pod holds GPUs by.
_HELD = f"({_GPU_POD} || size(variables.draHeld) == 0 ? 'a GPU pod' : 'a pod holding GPUs by ' + variables.draNames)"
_GPU003_PRIVILEGED = (
    f"variables.containers.filter(e, {_PRIVILEGED}).map(e, "
    + _text("GPU003", f"e.label + ' is privileged in ' + {_HELD} + ' and would see every GPU on the node; "
            "remove securityContext.privileged'", "e.path + '.securityContext.privileged'")
    + ")"
)
_SYS_ADMIN_TEXT = _text(
    "GPU003",
    f"e.label + ' adds capability ' + c + ' in ' + {_HELD} + ' without a GPU of its own; the NVIDIA runtime treats "
    "CAP_SYS_ADMIN as privileged and gives it every GPU its image asks for (NVIDIA_VISIBLE_DEVICES=all in CUDA "
    "images); drop ' + c + ' or give the container its own GPU request'",
    "e.path + '.securityContext.capabilities.add[' + string(k) + ']'",
)
_GPU003_SYS_ADMIN = (
    f"variables.containers.filter(e, !({_PRIVILEGED}) && !({_OWN_GPU}) && size({_SYS_ADMIN_AT}) > 0).map(e, "
    f"cel.bind(k, {_SYS_ADMIN_AT}[0], cel.bind(c, string(e.c.securityContext.capabilities.add[k]), "
    f"{_SYS_ADMIN_TEXT})))"
)
GPU003 = CelValidation(privileged.ID, privileged.NAME, (
    "gpuNames", "gpuPrefixes", "gpuRuntimeClassNames", "configLabel", "configNames", "defaultConfig",
    "overridingConfigs", "draGpuClasses"), (
    GPU_AMOUNTS, ALLOCATED, CANDIDATES, DRA_HELD, DRA_NAMES,
    ("violations", f"{_GPU_POD} || size(variables.draHeld) > 0 ? {_GPU003_PRIVILEGED} + {_GPU003_SYS_ADMIN} : []"),
))

# --- GPU001 ----------------------------------------------------------------------------------------------
# Judged where nothing can patch (workload templates, and Pods after the mutating phase): a fraction
# or a negative value, a request different from the limit, a request without a limit.


def _not_whole(section: str, raw: str) -> str:
    return _text("GPU001", f"a.e.label + ': ' + a.r + ' {section[:-1]} ' + {raw} + ' is not a whole number; "
                 f"{FRACTION}'", f"a.e.path + '.resources.{section}[' + a.r + ']'")


_COUNT = "string(quantity({}).asInteger())"
_GPU001 = (
    "variables.gpuAmounts.map(a, "
    f"a.hasReq && !{quantity_ok('a.req')} ? [{_not_whole('requests', 'a.req')}] : "
    f"a.hasLim && !{quantity_ok('a.lim')} ? [{_not_whole('limits', 'a.lim')}] : "
    "a.hasReq && a.hasLim && quantity(a.req).compareTo(quantity(a.lim)) != 0 ? ["
    + _text("GPU001", f"a.e.label + ': ' + a.r + ' request ' + {_COUNT.format('a.req')} + ' != limit ' + "
            f"{_COUNT.format('a.lim')} + '; set both to the same whole number ({FRACTION})'",
            "a.e.path + '.resources.requests[' + a.r + ']'")
    + "] : a.hasReq && !a.hasLim ? ["
    + _text("GPU001", f"a.e.label + ': ' + a.r + ' has request ' + {_COUNT.format('a.req')} + ' but no limit; "
            f"set limits.' + a.r + ' to ' + {_COUNT.format('a.req')}",
            "a.e.path + '.resources.limits[' + a.r + ']'")
    + "] : []).flatten()"
)
GPU001 = CelValidation(gpu_limits.ID, gpu_limits.NAME, ("gpuNames", "gpuPrefixes"), (
    GPU_AMOUNTS, ("violations", _GPU001),
))

# --- GPU009 ----------------------------------------------------------------------------------------------
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
    f".filter(i, cs[i].?opaque.?driver.orValue('') == '{dra.DRIVER}').map(i, "
    "{'o': dyn(cs[i].opaque.?parameters.orValue(null)), "
    "'p': dyn(variables.specPath + '.devices.config[' + string(i) + '].opaque.parameters')}))"
)
_GPU_REQUEST = "r.s.?deviceClassName.orValue('') in variables.draGpuClasses"
_REQUEST_TEXTS = (
    "variables.deviceRequests.filter(r, " + _GPU_REQUEST + ").map(r, "
    "(r.s.?allocationMode.orValue('') == 'All' && !(variables.claimNamespace in "
    "variables.draAllocationModeAllNamespaces) ? ["
    + _text("GPU009", "'request \"' + r.n + '\" asks for allocationMode All of DeviceClass ' + "
            "string(r.s.deviceClassName) + ' (every matching GPU of a node) in namespace ' + "
            "variables.claimNamespace + "
            "'; allowed only in the namespaces of policy dra.allocationModeAllNamespaces: ask for a count'",
            "r.p + '.allocationMode'")
    + "] : []) + (r.s.?adminAccess.orValue(false) == true && !(variables.claimNamespace in "
    "variables.draAdminAccessNamespaces) ? ["
    + _text("GPU009", "'request \"' + r.n + '\" asks for adminAccess to DeviceClass ' + string(r.s.deviceClassName) + "
            "', which reaches GPUs other pods hold, in namespace ' + variables.claimNamespace + "
            "'; allowed only in the namespaces of policy dra.adminAccessNamespaces'", "r.p + '.adminAccess'")
    + "] : [])).flatten()"
)
_KINDS = list(dra.SHARING_KINDS)
_STRATEGIES = list(DRA_SHARING_STRATEGIES)
# [path, problem] of an NVIDIA opaque config the driver could not read (dra.ClaimSpec._read_config), or [].
_PROBLEM = (
    "type(c.o) != map ? [dyn(c.p), dyn('parameters of driver " + dra.DRIVER + " are not an object')] : "
    f"c.o.?apiVersion.orValue(null) != '{dra.CONFIG_API_VERSION}' ? [dyn(c.p + '.apiVersion'), "
    f"dyn('apiVersion is not {dra.CONFIG_API_VERSION}')] : "
    f"!(c.o.?kind.orValue(null) in {_KINDS!r}) || c.o.?sharing.orValue(null) == null ? [] : "
    "type(c.o.sharing) != map ? [dyn(c.p + '.sharing'), dyn('sharing is not an object')] : "
    f"!(c.o.sharing.?strategy.orValue(null) in {_STRATEGIES!r}) ? [dyn(c.p + '.sharing.strategy'), "
    f"dyn('sharing.strategy is not {' or '.join(_STRATEGIES)}')] : "
    "c.o.sharing.?mpsConfig.orValue(null) != null && type(c.o.sharing.mpsConfig) != map ? "
    "[dyn(c.p + '.sharing.mpsConfig'), dyn('mpsConfig is not an object')] : "
    "cel.bind(l, c.o.sharing.?mpsConfig.orValue(null) == null ? null : "
    "c.o.sharing.mpsConfig.?defaultPinnedDeviceMemoryLimit.orValue(null), l != null && !("
    "type(l) == string ? isQuantity(l) : type(l) == int)) ? "
    "[dyn(c.p + '.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit'), "
    "dyn('defaultPinnedDeviceMemoryLimit is not a quantity')] : []"
)
_PROBLEM_TEXTS = (
    f"variables.nvidiaConfigs.map(c, cel.bind(x, {_PROBLEM}, size(x) == 0 ? [] : ["
    + _text("GPU009", "'opaque config for driver " + dra.DRIVER + " cannot be read: ' + x[1] + '; the driver would "
            "refuse the claim when its pod starts'", "x[0]")
    + "])).flatten()"
)
_GATES = "{" + ", ".join(f"'{k}': '{v}'" for k, v in dra_claims.FEATURE_GATES.items()) + "}"
_SHARING_TEXTS = (
    f"variables.nvidiaConfigs.filter(c, size({_PROBLEM}) == 0 && type(c.o) == map && "
    f"c.o.?kind.orValue(null) in {_KINDS!r} && c.o.?sharing.orValue(null) != null && "
    "!(c.o.sharing.strategy in variables.draSharingStrategies)).map(c, "
    + _text("GPU009", "'GPU sharing strategy ' + c.o.sharing.strategy + ' is not enabled for the NVIDIA DRA "
            f"driver; set {dra_claims.SHARING_KEY} to include ' + c.o.sharing.strategy + ' (the driver\\'s "
            f"feature gate ' + {_GATES}[c.o.sharing.strategy] + ') or remove the sharing config'",
            "c.p + '.sharing.strategy'")
    + ")"
)
GPU009 = CelValidation(dra_claims.ID, dra_claims.NAME, (
    "draGpuClasses", "draAllocationModeAllNamespaces", "draAdminAccessNamespaces", "draSharingStrategies"), (
    ("claimSpec", _CLAIM_SPEC), ("specPath", _SPEC_PATH),
    ("claimNamespace", "object.?metadata.?namespace.orValue('')"),
    ("deviceRequests", _REQUESTS), ("nvidiaConfigs", _CONFIGS),
    ("violations", f"{_REQUEST_TEXTS} + {_PROBLEM_TEXTS} + {_SHARING_TEXTS}"),
), target="dra")

POLICIES: tuple[CelValidation, ...] = (GPU001, GPU002, GPU003, GPU007, GPU009)
