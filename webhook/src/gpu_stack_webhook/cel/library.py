"""CEL building blocks shared by the generated policies, and the config they read.

Every policy matches Pods and the workload kinds; `object` is whichever it is. The variables below
find the pod spec (as rules see it through pod.PodView) and list its containers of the three kinds
with the label and path the webhook's messages use. Config-dependent facts are *config variables*:
CEL literals the chart renders from its values (templates/webhook/_cel.tpl) and `config_values`
computes from a PolicyConfig, so offline evaluation and the chart read the same config; a chart test
compares the two for every overlay.
"""

from __future__ import annotations

from typing import Any

from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.pod import CONTAINER_FIELDS
from gpu_stack_webhook.policy.rules.gpu_limits import FRACTION_HINT
from gpu_stack_webhook.policy.sharing import SharingIndex

Variable = tuple[str, str]  # (name, CEL expression)

# The webhook reads `spec`; the workloads' pod template under it (pod.POD_SPEC_LOCATIONS).
_TEMPLATE = "object.spec.template"
_CRON_TEMPLATE = "object.spec.jobTemplate.spec.template"


def _by_kind(pod: str, cron: str, template: str) -> str:
    return f"object.kind == 'Pod' ? {pod} : object.kind == 'CronJob' ? {cron} : {template}"


# Kubernetes' CEL checker wants one value type per map or list literal: mixed entries are wrapped in dyn().
def _container_entries(field: str, kind: str) -> str:
    spec = f"variables.podSpec.{field}"
    return (
        f"lists.range(size(variables.podSpec.?{field}.orValue([]))).map(i, "
        f"{{'label': dyn('{kind} \"' + {spec}[i].?name.orValue('#' + string(i)) + '\"'), "
        f"'path': dyn(variables.podPath + '.{field}[' + string(i) + ']'), "
        f"'pointer': dyn('/' + variables.podPath.replace('.', '/') + '/{field}/' + string(i)), "
        f"'c': dyn({spec}[i])}})"
    )


POD_VARIABLES: tuple[Variable, ...] = (
    ("podSpec", _by_kind("object.spec", f"{_CRON_TEMPLATE}.spec", f"{_TEMPLATE}.spec")),
    ("podPath", _by_kind("'spec'", "'spec.jobTemplate.spec.template.spec'", "'spec.template.spec'")),
    ("metaPath", _by_kind("'metadata'", "'spec.jobTemplate.spec.template.metadata'", "'spec.template.metadata'")),
    ("annotations", "(" + _by_kind("object.metadata", f"{_CRON_TEMPLATE}.?metadata.orValue({{}})",
                                   f"{_TEMPLATE}.?metadata.orValue({{}})") + ").?annotations.orValue({})"),
    # Every container of the three kinds, in spec order: {label, path, pointer, c}.
    ("containers", " + ".join(_container_entries(field, kind) for field, kind in CONTAINER_FIELDS)),
)


def is_gpu(resource: str) -> str:
    """CEL: is `resource` (an expression) a GPU resource name (SharingIndex.is_gpu)?"""
    return f"({resource} in variables.gpuNames || variables.gpuPrefixes.exists(p, {resource}.startsWith(p)))"


def quantity_ok(raw: str) -> str:
    """CEL: `raw` (a string) is a quantity, a whole number and not negative (GPU001's test)."""
    return (f"(isQuantity({raw}) && quantity({raw}).isInteger() && "
            f"quantity({raw}).compareTo(quantity('0')) >= 0)")


# Every GPU resource named in a container's requests or limits (policy.gpus.gpu_amounts), flattened:
# {e: container entry, r: resource, hasReq, hasLim, req, lim} with req/lim as strings ('' when absent).
GPU_AMOUNTS: Variable = ("gpuAmounts", (
    "variables.containers.map(e, "
    "cel.bind(rq, e.c.?resources.?requests.orValue({}), cel.bind(lm, e.c.?resources.?limits.orValue({}), "
    f"(rq.map(r, r) + lm.filter(r, !(r in rq))).filter(r, {is_gpu('r')}).map(r, "
    "{'e': dyn(e), 'r': dyn(r), 'hasReq': dyn(r in rq), 'hasLim': dyn(r in lm), "
    "'req': dyn(r in rq ? string(rq[r]) : ''), 'lim': dyn(r in lm ? string(lm[r]) : '')})))).flatten()"
))

# Every deviceclass.resource.kubernetes.io/<GPU class> resource a container is given (count above 0: limit,
# else request), in the order policy.dra.dra_gpus reads them: {path: container path, r: resource}.
_DRA_PREFIX = "deviceclass.resource.kubernetes.io/"
DRA_HELD: Variable = ("draHeld", (
    "variables.containers.map(e, "
    "cel.bind(rq, e.c.?resources.?requests.orValue({}), cel.bind(lm, e.c.?resources.?limits.orValue({}), "
    f"(rq.map(r, r) + lm.filter(r, !(r in rq))).filter(r, r.startsWith('{_DRA_PREFIX}') && "
    f"r.substring({len(_DRA_PREFIX)}) in variables.draGpuClasses && "
    "cel.bind(n, r in lm ? string(lm[r]) : string(rq[r]), isQuantity(n) && quantity(n).compareTo(quantity('0')) > 0)"
    ").map(r, {'path': dyn(e.path), 'r': dyn(r)})))).flatten()"
))
# "a pod holding GPUs by <resource>, ..." (rules.privileged / visible_devices): draHeld's names, each once.
DRA_NAMES = ("draNames", "cel.bind(l, variables.draHeld.map(h, h.r), "
             "lists.range(size(l)).filter(i, lists.range(i).all(j, l[j] != l[i])).map(i, l[i]).join(', '))")


# The count a GPU amount gives its container (limit, else request), > 0 (policy.gpus.allocated_gpus).
_ALLOCATES = ("cel.bind(n, a.hasLim ? a.lim : a.req, isQuantity(n) && quantity(n).compareTo(quantity('0')) > 0)")
ALLOCATED: Variable = ("allocatedPaths", f"variables.gpuAmounts.filter(a, {_ALLOCATES}).map(a, a.e.path)")

# The device plugin configs the pod can land on (sharing.SharingIndex.candidates): its nodeSelector on
# the config label; else, when every required node affinity term has an `In` on it, those values;
# else every config. A name that is no config means the default one.
_SELECTED = "variables.podSpec.?nodeSelector.orValue({})"
_TERMS = ("variables.podSpec.?affinity.?nodeAffinity.?requiredDuringSchedulingIgnoredDuringExecution"
          ".?nodeSelectorTerms.orValue([])")
_LABEL_IN = ("t.?matchExpressions.orValue([]).filter(x, x.key == variables.configLabel && x.operator == 'In' "
             "&& has(x.values))")
CANDIDATES: Variable = ("candidateConfigs", (
    f"cel.bind(named, (variables.configLabel in {_SELECTED} ? [{_SELECTED}[variables.configLabel]] : "
    f"size({_TERMS}) > 0 && {_TERMS}.all(t, size({_LABEL_IN}) > 0) ? "
    f"{_TERMS}.map(t, {_LABEL_IN}[0].values).flatten() : variables.configNames)"
    ".map(n, n in variables.configNames ? n : variables.defaultConfig), "
    "size(named) > 0 ? named : variables.configNames)"
))


def violations_message() -> str:
    """The denial text from `variables.violations`, as engine.denial_message joins findings."""
    v = "variables.violations"
    return (f"size({v}) == 1 ? {v}[0] : string(size({v})) + ' GPU policy violations: ' + "
            f"lists.range(size({v})).map(i, '[' + string(i + 1) + '] ' + {v}[i]).join('; ')")


def config_values(config: PolicyConfig) -> dict[str, Any]:
    """The config variables for `config`, as plain JSON values (the chart renders the same ones)."""
    index = SharingIndex(config)
    mps = config.mps
    return {
        "gpuNames": sorted(index.gpu_names),
        "gpuPrefixes": sorted(index.gpu_prefixes),
        "gpuRuntimeClassNames": sorted(config.gpu_runtime_class_names),
        "configLabel": index.label,
        "configNames": sorted(index.configs),
        "defaultConfig": index.default,
        "overridingConfigs": sorted(n for n, c in index.configs.items() if c.list_overrides_image_env),
        # Per config: resource -> strategy, the names renamed away, and whether MIG is mixed.
        "exposed": {n: {r: e.strategy.value for r, e in sorted(c.exposed.items())} for n, c in index.configs.items()},
        "replaced": {n: sorted(c.replaced) for n, c in index.configs.items()},
        "mixedMigConfigs": sorted(n for n, c in index.configs.items() if c.mig_strategy == "mixed"),
        "mpsConfigNames": sorted(index.mps_config_names),
        "mpsAnnotation": mps.annotation,
        "mpsNodeSelector": dict(sorted(mps.node_selector.items())),
        "mpsTolerations": [t.as_k8s() for t in mps.tolerations],
        "injectHostIPC": mps.inject_host_ipc,
        "injectRuntimeClassName": config.inject_runtime_class_name,
        "nvidiaRuntimeIsDefault": config.nvidia_runtime_is_default,
        "disabledRules": sorted(config.rules.disabled),
        # Dynamic Resource Allocation (config.DraPolicy; GPU002, GPU003, GPU009).
        "draGpuClasses": sorted(set(config.dra.gpu_device_classes)),
        "draAllocationModeAllNamespaces": sorted(set(config.dra.allocation_mode_all_namespaces)),
        "draAdminAccessNamespaces": sorted(set(config.dra.admin_access_namespaces)),
        "draSharingStrategies": sorted(set(config.dra.sharing_strategies)),
        "draMpsDefaultLimit": config.dra.mps_default_pinned_device_memory_limit,
    }


FRACTION = FRACTION_HINT


def lower_binds(expr: str) -> str:
    """`cel.bind(x, value, body)` -> `[value].map(x, body)[0]`: the Kubernetes CEL environment has no
    bindings extension, so the generated policies write the binding as a one-element comprehension."""
    start = expr.find("cel.bind(")
    if start < 0:
        return expr
    args, end = _call_args(expr, start + len("cel.bind("))
    name, value, body = (lower_binds(a.strip()) for a in args)
    return expr[:start] + f"[{value}].map({name}, {body})[0]" + lower_binds(expr[end:])


def _call_args(expr: str, pos: int) -> tuple[list[str], int]:
    """The top-level comma-separated arguments from `pos` to the matching `)`, and the index after it."""
    args, depth, quote, begin = [], 0, "", pos
    for i in range(pos, len(expr)):
        ch = expr[i]
        if quote:
            if ch == quote and expr[i - 1] != "\\":
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                args.append(expr[begin:i])
                return args, i + 1
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(expr[begin:i])
            begin = i + 1
    raise ValueError(f"unbalanced cel.bind in {expr[:80]}...")
