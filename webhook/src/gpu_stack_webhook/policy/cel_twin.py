"""What a rule module writes its CEL twin with: the policy declarations (CelValidation, CelMutation), message
templates shared by the Python finding and the CEL messageExpression (Message), and the CEL building blocks
several rules read (where the pod spec is, its containers, its GPU amounts, the device plugin configs it
can land on). cel/ assembles the policies from the rule modules (policy/rules/__init__.py RULES) and
renders them into the chart; tests/property/test_cel_equivalence.py holds both to the same verdicts.

Every policy matches Pods and the workload kinds; `object` is whichever it is. Config-dependent facts are
*config variables*: CEL literals the chart renders from its values (templates/webhook/_cel.tpl) and
cel/library.config_values computes from a PolicyConfig.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from gpu_stack_webhook.policy.dra import EXTENDED_RESOURCE_PREFIX
from gpu_stack_webhook.policy.pod import CONTAINER_FIELDS

Variable = tuple[str, str]  # (name, CEL expression)


@dataclass(frozen=True)
class CelValidation:
    """A ValidatingAdmissionPolicy: `variables` end with `violations`, the texts of the Python rule's
    denials (Finding.text); the policy denies when it is not empty."""

    rule_id: str
    name: str
    # Config variables (cel/library.config_values keys) the expressions read; the chart renders them first.
    config: tuple[str, ...]
    variables: tuple[Variable, ...]
    # What it matches: "pods" (Pods and workloads: the pod variables come first) or "dra" (ResourceClaims
    # and ResourceClaimTemplates).
    target: str = "pods"


@dataclass(frozen=True)
class CelMutation:
    """A MutatingAdmissionPolicy: `patch` is CEL for a list of JSONPatch operations."""

    rule_id: str
    name: str
    config: tuple[str, ...]
    variables: tuple[Variable, ...]
    patch: str
    target: str = "pods"  # "pods" (Pods being created) or "dra" (ResourceClaims, ResourceClaimTemplates)


class Literal(str):
    """A message field given as plain text on the CEL side too (spliced into the literal around it)."""


class Message:
    """One message text, written once: `message(**values)` is the Python finding's text, `message.cel(**exprs)`
    the CEL string expression that gives the same text (fields become the CEL expressions given, or plain
    text for a Literal)."""

    __slots__ = ("template",)

    def __init__(self, template: str) -> None:
        self.template = template

    def __call__(self, **values: object) -> str:
        return self.template.format(**values)

    def cel(self, **exprs: str) -> str:
        parts: list[tuple[bool, str]] = []  # (is text, content)
        for text, field, _, _ in string.Formatter().parse(self.template):
            if text:
                parts.append((True, text))
            if field is not None:
                value = exprs[field]
                parts.append((isinstance(value, Literal), str(value)))
        merged: list[tuple[bool, str]] = []
        for is_text, content in parts:
            if is_text and merged and merged[-1][0]:
                merged[-1] = (True, merged[-1][1] + content)
            else:
                merged.append((is_text, content))
        return " + ".join(_quoted(content) if is_text else content for is_text, content in merged)


def _quoted(text: str) -> str:
    """A CEL string literal: single quotes, or double quotes for a text with an apostrophe and no double quote."""
    if "'" in text and '"' not in text:
        return '"' + text.replace("\\", "\\\\") + '"'
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def finding_text(rule_id: str, message: str, path: str) -> str:
    """CEL for Finding.text: '<ID> <message> (<path>)' (message and path are CEL string expressions)."""
    return f"'{rule_id} ' + {message} + ' (' + {path} + ')'"


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
# else request), in the order policy.dra.dra_gpus reads them (by name: draGpuClasses is sorted, and a map's
# keys have no order in CEL): {path: container path, r: resource}.
DRA_HELD: Variable = ("draHeld", (
    "variables.containers.map(e, "
    "cel.bind(rq, e.c.?resources.?requests.orValue({}), cel.bind(lm, e.c.?resources.?limits.orValue({}), "
    f"variables.draGpuClasses.map(d, '{EXTENDED_RESOURCE_PREFIX}' + d).filter(r, (r in rq || r in lm) && "
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


# Pods that run under the NVIDIA runtime (policy.signals.reaches_nvidia_runtime): GPU pods, or every pod where
# it is the node's default runtime; a pod holding GPUs by DRA that CEL can see (a
# deviceclass.resource.kubernetes.io/<GPU class> resource) too.
GPU_POD = ("(variables.podSpec.?runtimeClassName.orValue('') in variables.gpuRuntimeClassNames || "
           "size(variables.gpuAmounts) > 0)")
NVIDIA_RUNTIME = f"(variables.nvidiaRuntimeIsDefault || {GPU_POD} || size(variables.draHeld) > 0)"
RUNTIME_CONFIG = ("gpuNames", "gpuPrefixes", "gpuRuntimeClassNames", "nvidiaRuntimeIsDefault", "draGpuClasses")


def patch_op(path: str, value: str) -> str:
    """CEL for one JSONPatch `add` (runtime.py turns the JSONPatch type into a map offline)."""
    return f"JSONPatch{{op: 'add', path: {path}, value: {value}}}"


def add_map(exists: str, base: str, entries: str) -> str:
    """Ops adding `entries` ([key, value] pairs) under the map at `base`, creating it when absent."""
    keyed = f"{entries}.map(kv, {patch_op(base + ' + ' + repr('/') + ' + jsonpatch.escapeKey(kv[0])', 'kv[1]')})"
    return f"(size({entries}) == 0 ? [] : ({exists} ? [] : [{patch_op(base, '{}')}]) + {keyed})"
