"""GPU001 gpu-limits-equal-requests: every GPU resource has a whole-number limit equal to its request.

Kubernetes cannot overcommit extended resources and rejects a mismatch itself, but only after the
mutating webhooks and with a terse message. This rule answers first: it fills a missing limit from
the request on Pods being created (a warning says so), and denies a mismatch or a fraction with a
message that names the container, the resource, both values and what to do instead.
"""

from __future__ import annotations

from gpu_stack_webhook.policy.cel_twin import (
    GPU_AMOUNTS,
    CelMutation,
    CelValidation,
    Literal,
    Message,
    add_map,
    finding_text,
    quantity_ok,
)
from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.findings import Finding, Severity
from gpu_stack_webhook.policy.gpus import GpuAmount, gpu_amounts
from gpu_stack_webhook.policy.pod import ContainerRef, PodView, format_count, parse_count
from gpu_stack_webhook.policy.signals import Signal

ID = "GPU001"
NAME = "gpu-limits-equal-requests"
# The rule's row of docs/policy-rules.md (markdown; `make generate` writes the table).
DOC = (
    'every GPU resource (see [Which resources are GPUs](#which-resources-are-gpus)) has a whole-number limit '
    'equal to its request (`Infinity`, `NaN` are no count). The mutating pass fills a missing limit from the '
    'request (warning) and denies a mismatch or a fraction early, before Kubernetes rejects it with a terse '
    'message'
)
SCOPE = (Signal.GPU_RESOURCES,)  # policy/signals.py
FRACTION_HINT = "GPUs are whole devices; to share one use time-slicing, MPS or MIG"
NOT_WHOLE = Message(f"{{label}}: {{resource}} {{kind}} {{value}} is not a whole number; {FRACTION_HINT}")
MISMATCH = Message(f"{{label}}: {{resource}} request {{request}} != limit {{limit}}; set both to the same whole "
                   f"number ({FRACTION_HINT})")
NO_LIMIT = Message("{label}: {resource} has request {request} but no limit; set limits.{resource} to {request}")


def _deny(amount: GpuAmount, message: str, section: str) -> Finding:
    path = f"{amount.container.path}.resources.{section}[{amount.resource}]"
    return Finding(ID, Severity.DENY, message, path, deny_early=True)


def _fill_limits(pod: PodView, container: ContainerRef, missing: dict[str, object]) -> Finding:
    resources = container.spec.get("resources")
    if isinstance(resources, dict) and isinstance(resources.get("limits"), dict):
        pod.desired.edit(f"{container.pointer}/resources/limits").update(missing)
    elif isinstance(resources, dict):
        pod.desired.edit(f"{container.pointer}/resources")["limits"] = dict(missing)
    else:
        pod.desired.edit(container.pointer)["resources"] = {"limits": dict(missing)}
    names = ", ".join(f"{r}={v}" for r, v in missing.items())
    return Finding(
        ID,
        Severity.WARN,
        f"{container.label}: set GPU limit {names} from its request",
        f"{container.path}.resources.limits",
        changed=True,
    )


def check(pod: PodView, ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    # Only a Pod being created with a request and no limit fills these (most reviews never do).
    missing_limits: dict[str, dict[str, object]] = {}
    containers: dict[str, ContainerRef] = {}
    for amount in gpu_amounts(pod, ctx):
        raw = amount.request
        if raw == amount.limit and type(raw) is str and raw.isascii() and raw.isdigit():
            continue  # the common case, a whole number written alike in both: nothing to say
        request, limit = parse_count(raw), parse_count(amount.limit)
        for raw, value, section in ((amount.request, request, "requests"), (amount.limit, limit, "limits")):
            if raw is not None and (value is None or value != value.to_integral_value() or value < 0):
                findings.append(_deny(amount, NOT_WHOLE(label=amount.container.label, resource=amount.resource,
                                                        kind=section[:-1], value=str(raw)), section))
                break
        else:
            if request is not None and limit is not None and request != limit:
                findings.append(_deny(amount, MISMATCH(
                    label=amount.container.label, resource=amount.resource, request=format_count(request),
                    limit=format_count(limit)), "requests"))
            elif request is not None and limit is None:
                if ctx.can_patch:
                    containers[amount.container.pointer] = amount.container
                    missing_limits.setdefault(amount.container.pointer, {})[amount.resource] = amount.request
                else:
                    findings.append(_deny(amount, NO_LIMIT(
                        label=amount.container.label, resource=amount.resource, request=format_count(request)),
                        "limits"))
    for pointer, missing in missing_limits.items():
        findings.append(_fill_limits(pod, containers[pointer], missing))
    return findings


# --- The CEL twin ----------------------------------------------------------------------------------------
# Judged where nothing can patch (workload templates, and Pods after the mutating phase): a fraction
# or a negative value, a request different from the limit, a request without a limit.


def _not_whole(section: str, raw: str) -> str:
    return finding_text(ID, NOT_WHOLE.cel(label="a.e.label", resource="a.r", kind=Literal(section[:-1]), value=raw),
                        f"a.e.path + '.resources.{section}[' + a.r + ']'")


_COUNT = "string(quantity({}).asInteger())"
_VIOLATIONS = (
    "variables.gpuAmounts.map(a, "
    f"a.hasReq && !{quantity_ok('a.req')} ? [{_not_whole('requests', 'a.req')}] : "
    f"a.hasLim && !{quantity_ok('a.lim')} ? [{_not_whole('limits', 'a.lim')}] : "
    "a.hasReq && a.hasLim && quantity(a.req).compareTo(quantity(a.lim)) != 0 ? ["
    + finding_text(ID, MISMATCH.cel(label="a.e.label", resource="a.r", request=_COUNT.format("a.req"),
                                    limit=_COUNT.format("a.lim")),
                   "a.e.path + '.resources.requests[' + a.r + ']'")
    + "] : a.hasReq && !a.hasLim ? ["
    + finding_text(ID, NO_LIMIT.cel(label="a.e.label", resource="a.r", request=_COUNT.format("a.req")),
                   "a.e.path + '.resources.limits[' + a.r + ']'")
    + "] : []).flatten()"
)
CEL_VALIDATION = CelValidation(ID, NAME, ("gpuNames", "gpuPrefixes"), (GPU_AMOUNTS, ("violations", _VIOLATIONS)))

# The limit fill: a GPU resource with a valid request and no limit gets the request as its limit.
_FILLABLE = f"a.hasReq && !a.hasLim && {quantity_ok('a.req')}"
_FILL = (
    "variables.containers.filter(e, variables.gpuAmounts.exists(a, a.e.path == e.path && " + _FILLABLE + "))"
    ".map(e, " + add_map(
        "has(e.c.resources.limits)", "e.pointer + '/resources/limits'",
        f"variables.gpuAmounts.filter(a, a.e.path == e.path && {_FILLABLE})"
        ".map(a, [dyn(a.r), dyn(e.c.resources.requests[a.r])])",
    ) + ").flatten()"
)
CEL_MUTATION = CelMutation(ID, NAME, ("gpuNames", "gpuPrefixes"), (GPU_AMOUNTS,), _FILL)
