"""GPU001 gpu-limits-equal-requests: every GPU resource has a whole-number limit equal to its request.

Kubernetes cannot overcommit extended resources and rejects a mismatch itself, but only after the
mutating webhooks and with a terse message. This rule answers first: it fills a missing limit from
the request on Pods being created (a warning says so), and denies a mismatch or a fraction with a
message that names the container, the resource, both values and what to do instead.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from gpu_stack_webhook.policy.findings import Finding, JsonPatchOp, Severity
from gpu_stack_webhook.policy.pod import ContainerRef, PodView, format_count, parse_count, pointer_token
from gpu_stack_webhook.policy.rules.base import Context, GpuAmount, gpu_amounts

ID = "GPU001"
NAME = "gpu-limits-equal-requests"
FRACTION_HINT = "GPUs are whole devices; to share one use time-slicing, MPS or MIG"


def _deny(amount: GpuAmount, message: str, section: str) -> Finding:
    path = f"{amount.container.path}.resources.{section}[{amount.resource}]"
    return Finding(ID, Severity.DENY, f"{amount.container.label}: {message}", path, deny_early=True)


def _fill_limits(container: ContainerRef, missing: dict[str, object]) -> Iterator[Finding]:
    has_limits = isinstance((container.spec.get("resources") or {}).get("limits"), dict)
    has_resources = isinstance(container.spec.get("resources"), dict)
    ops: list[JsonPatchOp] = []
    if has_limits:
        base = f"{container.pointer}/resources/limits"
        ops = [{"op": "add", "path": f"{base}/{pointer_token(r)}", "value": v} for r, v in missing.items()]
    elif has_resources:
        ops = [{"op": "add", "path": f"{container.pointer}/resources/limits", "value": dict(missing)}]
    else:
        ops = [{"op": "add", "path": f"{container.pointer}/resources", "value": {"limits": dict(missing)}}]
    names = ", ".join(f"{r}={v}" for r, v in missing.items())
    yield Finding(
        ID,
        Severity.WARN,
        f"{container.label}: set GPU limit {names} from its request",
        f"{container.path}.resources.limits",
        patch=tuple(ops),
    )


def check(pod: PodView, ctx: Context) -> Iterator[Finding]:
    missing_limits: dict[str, dict[str, object]] = defaultdict(dict)
    containers: dict[str, ContainerRef] = {}
    for amount in gpu_amounts(pod, ctx):
        request, limit = parse_count(amount.request), parse_count(amount.limit)
        for raw, value, section in ((amount.request, request, "requests"), (amount.limit, limit, "limits")):
            if raw is not None and (value is None or value != value.to_integral_value() or value < 0):
                yield _deny(amount, f"{amount.resource} {section[:-1]} {raw!s} is not a whole number; "
                            f"{FRACTION_HINT}", section)
                break
        else:
            if request is not None and limit is not None and request != limit:
                yield _deny(
                    amount,
                    f"{amount.resource} request {format_count(request)} != limit {format_count(limit)}; "
                    f"set both to the same whole number ({FRACTION_HINT})",
                    "requests",
                )
            elif request is not None and limit is None:
                if ctx.can_patch:
                    containers[amount.container.pointer] = amount.container
                    missing_limits[amount.container.pointer][amount.resource] = amount.request
                else:
                    yield _deny(
                        amount,
                        f"{amount.resource} has request {format_count(request)} but no limit; "
                        f"set limits.{amount.resource} to {format_count(request)}",
                        "limits",
                    )
    for pointer, missing in missing_limits.items():
        yield from _fill_limits(containers[pointer], missing)
