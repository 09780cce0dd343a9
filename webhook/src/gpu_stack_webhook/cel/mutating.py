"""MutatingAdmissionPolicies (JSONPatch) for what /mutate changes on Pods being created.

- GPU001 fill: a GPU resource with a valid request and no limit gets the request as its limit.
- GPU006 MPS injection: hostIPC (when `injectHostIPC`), the missing MPS tolerations, and for the
  annotation opt-in the missing MPS node selector labels; an MPS pod is recognised exactly as
  rules.mps.mps_reason does (annotation, nodeSelector/affinity on MPS labels or MPS configs, a
  resource every candidate config shares through MPS). An opt-in whose nodeSelector excludes MPS nodes
  is left alone (the webhook denies it; CEL cannot).
- GPU008: `runtimeClassName` for a Pod that allocates a GPU and names none (`injectRuntimeClassName`).
- GPU009 MPS memory limit: a ResourceClaim or ResourceClaimTemplate being created whose NVIDIA opaque config
  shares through MPS (enabled in `dra.sharingStrategies`) without `mpsConfig.defaultPinnedDeviceMemoryLimit`
  gets `dra.mpsDefaultPinnedDeviceMemoryLimit` (target "dra": its own matchConstraints).

Like the webhook, every patch first checks what is there (reinvocationPolicy IfNeeded adds nothing
twice), and the policies are independent of each other's order: the limit fill changes no count the
others read. Where a map does not exist yet the patch adds it empty first, then one key per op, so the
pod is the same as after the webhook's patch (tests/property/test_cel_equivalence.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_stack_webhook.cel import validating
from gpu_stack_webhook.cel.library import ALLOCATED, CANDIDATES, GPU_AMOUNTS, Variable, quantity_ok
from gpu_stack_webhook.policy.dra import MPS
from gpu_stack_webhook.policy.rules import dra_claims, gpu_limits, mps, runtime_class


@dataclass(frozen=True)
class CelMutation:
    rule_id: str
    name: str
    config: tuple[str, ...]
    variables: tuple[Variable, ...]
    patch: str  # CEL: a list of JSONPatch
    target: str = "pods"  # "pods" (Pods being created) or "dra" (ResourceClaims, ResourceClaimTemplates)


def patch_op(path: str, value: str) -> str:
    """CEL for one JSONPatch `add` (runtime.py turns the JSONPatch type into a map offline)."""
    return f"JSONPatch{{op: 'add', path: {path}, value: {value}}}"


def _add_map(exists: str, base: str, entries: str) -> str:
    """Ops adding `entries` ([key, value] pairs) under the map at `base`, creating it when absent."""
    keyed = f"{entries}.map(kv, {patch_op(base + ' + ' + repr('/') + ' + jsonpatch.escapeKey(kv[0])', 'kv[1]')})"
    return f"(size({entries}) == 0 ? [] : ({exists} ? [] : [{patch_op(base, '{}')}]) + {keyed})"


# --- GPU001: fill the limit ------------------------------------------------------------------------------
_FILLABLE = f"a.hasReq && !a.hasLim && {quantity_ok('a.req')}"
_FILL = (
    "variables.containers.filter(e, variables.gpuAmounts.exists(a, a.e.path == e.path && " + _FILLABLE + "))"
    ".map(e, " + _add_map(
        "has(e.c.resources.limits)", "e.pointer + '/resources/limits'",
        f"variables.gpuAmounts.filter(a, a.e.path == e.path && {_FILLABLE})"
        ".map(a, [dyn(a.r), dyn(e.c.resources.requests[a.r])])",
    ) + ").flatten()"
)
FILL_LIMITS = CelMutation(gpu_limits.ID, gpu_limits.NAME, ("gpuNames", "gpuPrefixes"), (GPU_AMOUNTS,), _FILL)

# --- GPU008: runtime class -------------------------------------------------------------------------------
RUNTIME_CLASS = CelMutation(
    runtime_class.ID, runtime_class.NAME, ("gpuNames", "gpuPrefixes", "injectRuntimeClassName"),
    (GPU_AMOUNTS, ALLOCATED),
    "variables.injectRuntimeClassName != '' && variables.podSpec.?runtimeClassName.orValue('') == '' && "
    "size(variables.allocatedPaths) > 0 ? "
    f"[{patch_op(repr('/spec/runtimeClassName'), 'variables.injectRuntimeClassName')}] : []",
)

# --- GPU006: MPS ---------------------------------------------------------------------------------------
_SELECTS = ("(k == variables.configLabel ? vals.exists(v, v in variables.mpsConfigNames) : "
            "k in variables.mpsNodeSelector && variables.mpsNodeSelector[k] in vals)")
_BY_SELECTOR = (
    "variables.podSpec.?nodeSelector.orValue({}).exists(k, cel.bind(vals, [variables.podSpec.nodeSelector[k]], "
    f"{_SELECTS}))"
)
_BY_AFFINITY = (
    "variables.podSpec.?affinity.?nodeAffinity.?requiredDuringSchedulingIgnoredDuringExecution"
    ".?nodeSelectorTerms.orValue([]).exists(t, t.?matchExpressions.orValue([]).exists(x, x.operator == 'In' && "
    f"cel.bind(k, x.key, cel.bind(vals, x.?values.orValue([]), {_SELECTS}))))"
)
# sharing.NodeConfig.lookup: the strategy config n gives resource r, '' when n does not expose it.
_LOOKUP = ("(r in variables.exposed[n] ? variables.exposed[n][r] : n in variables.mixedMigConfigs && "
           "r.startsWith('nvidia.com/mig-') && !(r in variables.replaced[n]) ? 'exclusive' : '')")
_BY_RESOURCE = (
    "variables.gpuAmounts.exists(a, cel.bind(r, a.r, "
    f"variables.candidateConfigs.exists(n, {_LOOKUP} != '') && "
    f"variables.candidateConfigs.all(n, {_LOOKUP} in ['', 'mps'])))"
)
_OPTED_IN = ("variables.mpsAnnotation in variables.annotations && "
             "string(variables.annotations[variables.mpsAnnotation]).lowerAscii() == 'true'")
_CONFLICT = ("variables.mpsNodeSelector.exists(k, k in variables.podSpec.?nodeSelector.orValue({}) && "
             "string(variables.podSpec.nodeSelector[k]) != variables.mpsNodeSelector[k])")


def _normalized(t: str) -> str:
    """A toleration as [key, operator, value, effect] with the webhook's defaults (rules.mps._normalized)."""
    return (f"[{t}.?key.orValue(''), {t}.?operator.orValue('') == '' ? 'Equal' : {t}.operator, "
            f"{t}.?value.orValue(''), {t}.?effect.orValue('')]")


# rules.mps._covers: does toleration h tolerate every taint w tolerates?
_COVERS = ("(h[3] == '' || h[3] == w[3]) && (h[1] == 'Exists' ? h[0] in ['', w[0]] : "
           "h[0] == w[0] && w[1] == 'Equal' && h[2] == w[2])")
_MISSING_TOLERATIONS = (
    "variables.mpsTolerations.filter(want, cel.bind(w, " + _normalized("want") + ", "
    "!variables.podSpec.?tolerations.orValue([]).exists(have, cel.bind(h, " + _normalized("have") + ", "
    + _COVERS + "))))"
)
_MPS_PATCH = (
    "(variables.injectHostIPC && variables.podSpec.?hostIPC.orValue(false) != true ? "
    f"[{patch_op(repr('/spec/hostIPC'), 'true')}] : []) + "
    "(has(variables.podSpec.tolerations) ? variables.missingTolerations.map(t, "
    f"{patch_op(repr('/spec/tolerations/-'), 't')}) : size(variables.missingTolerations) > 0 ? "
    f"[{patch_op(repr('/spec/tolerations'), 'variables.missingTolerations')}] : []) + "
    "(variables.optedIn ? " + _add_map(
        "has(variables.podSpec.nodeSelector)", "'/spec/nodeSelector'",
        "variables.mpsNodeSelector.filter(k, !(k in variables.podSpec.?nodeSelector.orValue({})))"
        ".map(k, [dyn(k), dyn(variables.mpsNodeSelector[k])])") + " : [])"
)
MPS_INJECTION = CelMutation(
    mps.ID, mps.NAME,
    ("gpuNames", "gpuPrefixes", "configLabel", "configNames", "defaultConfig", "exposed", "replaced",
     "mixedMigConfigs", "mpsConfigNames", "mpsAnnotation", "mpsNodeSelector", "mpsTolerations", "injectHostIPC"),
    (GPU_AMOUNTS, CANDIDATES,
     ("optedIn", _OPTED_IN),
     ("isMpsPod", f"variables.optedIn || {_BY_SELECTOR} || {_BY_AFFINITY} || {_BY_RESOURCE}"),
     ("missingTolerations", _MISSING_TOLERATIONS)),
    f"!variables.isMpsPod || (variables.optedIn && {_CONFLICT}) ? [] : {_MPS_PATCH}",
)

# --- GPU009: the MPS memory limit of a DRA claim --------------------------------------------------------
# validating.GPU009's claim variables; an entry gets the limit when the driver could read it (no problem),
# its strategy is MPS and enabled, and it sets no limit (rules.dra_claims.check_object).
_LIMIT_WANTED = (
    f"size({validating._PROBLEM}) == 0 && type(c.o) == map && c.o.?kind.orValue(null) in {validating._KINDS!r} && "
    f"c.o.?sharing.orValue(null) != null && c.o.sharing.strategy == '{MPS}' && "
    f"'{MPS}' in variables.draSharingStrategies && "
    "c.o.sharing.?mpsConfig.?defaultPinnedDeviceMemoryLimit.orValue(null) == null"
)
_POINTER = "'/' + c.p.replace('.', '/').replace('[', '/').replace(']', '') + '/sharing/mpsConfig'"
_LIMIT_PATCH = (
    "variables.draMpsDefaultLimit == '' ? [] : "
    f"variables.nvidiaConfigs.filter(c, {_LIMIT_WANTED}).map(c, "
    "type(c.o.sharing.?mpsConfig.orValue(null)) == map ? "
    f"{patch_op(_POINTER + ' + ' + repr('/defaultPinnedDeviceMemoryLimit'), 'variables.draMpsDefaultLimit')} : "
    f"{patch_op(_POINTER, '{' + repr('defaultPinnedDeviceMemoryLimit') + ': variables.draMpsDefaultLimit}')})"
)
MPS_MEMORY_LIMIT = CelMutation(
    dra_claims.ID, dra_claims.NAME, ("draSharingStrategies", "draMpsDefaultLimit"),
    tuple((n, e) for n, e in validating.GPU009.variables if n != "violations"),
    _LIMIT_PATCH, target="dra",
)

POLICIES: tuple[CelMutation, ...] = (FILL_LIMITS, MPS_INJECTION, RUNTIME_CLASS, MPS_MEMORY_LIMIT)
