"""GPU arithmetic shared by the rules: which GPU resources each container names and what it is given, which
device plugin configs the pod can land on, and whether it is a GPU pod at all."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.facts import ClusterFacts
from gpu_stack_webhook.policy.pod import ContainerRef, PodView, parse_count
from gpu_stack_webhook.policy.runtime_classes import is_gpu_runtime_class
from gpu_stack_webhook.policy.sharing import NodeConfig, SharingIndex


class GpuAmount:
    """One GPU resource of one container (a plain class, built per review: see pod.ContainerRef)."""

    __slots__ = ("container", "count", "limit", "request", "resource")

    def __init__(self, container: ContainerRef, resource: str, request: Any, limit: Any,
                 count: Decimal | None) -> None:
        self.container = container
        self.resource = resource
        self.request = request  # raw values as written, None when absent
        self.limit = limit
        # What the container will be given: the limit, else the request (None: not a count). Parsed once.
        self.count = count

    def __repr__(self) -> str:
        return f"GpuAmount({self.container.path} {self.resource}: {self.request!r}/{self.limit!r})"

    @property
    def allocated(self) -> bool:
        """The device plugin allocates this resource to the container: a count above 0."""
        return self.count is not None and self.count > 0


def gpu_amounts(pod: PodView, ctx: Context) -> tuple[GpuAmount, ...]:
    """Every GPU resource named in any container's requests or limits."""
    # Memo entries are (what they depend on, value): several rules ask, on every review.
    memo: tuple[SharingIndex, tuple[GpuAmount, ...]] | None = pod.memo.get(gpu_amounts)
    if memo is not None and memo[0] is ctx.sharing:
        return memo[1]
    sharing = ctx.sharing
    found = []
    for container in pod.containers():
        requests, limits = container.requests, container.limits
        # Requests first, then limits without a request: each resource once, in the order written.
        for resource, request in requests.items():
            if sharing.is_gpu(resource):
                limit = limits.get(resource)
                found.append(GpuAmount(container, resource, request, limit,
                                       parse_count(limit if limit is not None else request)))
        for resource, limit in limits.items():
            if resource not in requests and sharing.is_gpu(resource):
                found.append(GpuAmount(container, resource, None, limit, parse_count(limit)))
    amounts = tuple(found)
    pod.memo[gpu_amounts] = (sharing, amounts)
    return amounts


def candidate_configs(pod: PodView, ctx: Context) -> list[NodeConfig]:
    """The device plugin configs of every node the pod could land on (memoized per pod). A pod pinned
    to a node with spec.nodeName is judged against that node's config when its label can be read
    (lookups on); otherwise, and for every other pod, against what its selectors allow."""
    memo: tuple[SharingIndex, ClusterFacts, list[NodeConfig]] | None = pod.memo.get(candidate_configs)
    if memo is not None and memo[0] is ctx.sharing and memo[1] is ctx.facts:
        return memo[2]
    node = pod.spec.get("nodeName")
    label = (ctx.facts.node_label(node, ctx.sharing.label)
             if ctx.facts.online and isinstance(node, str) and node else None)
    if label is not None and label.known:
        found = [ctx.sharing.for_node_label(label.value)]
    else:
        found = ctx.sharing.candidates(pod)
    pod.memo[candidate_configs] = (ctx.sharing, ctx.facts, found)
    return found


def allocated_gpus(pod: PodView, ctx: Context) -> dict[str, list[str]]:
    """Per container pointer, the GPU resources the device plugin allocates to that container itself
    (a count above 0; ephemeral containers cannot have resources, so they never have one)."""
    out: dict[str, list[str]] = {}
    for amount in gpu_amounts(pod, ctx):
        if amount.allocated:
            out.setdefault(amount.container.pointer, []).append(amount.resource)
    return out


def allocates_gpus(pod: PodView, ctx: Context) -> bool:
    """Does the device plugin allocate a GPU to any container (allocated_gpus is not empty)?"""
    return any(amount.allocated for amount in gpu_amounts(pod, ctx))


def is_gpu_pod(pod: PodView, ctx: Context) -> bool:
    """A pod that requests any GPU resource in any container, or runs with a GPU runtime class (or one whose
    runtime cannot be known: policy/runtime_classes.py)."""
    runtime_class = pod.spec.get("runtimeClassName")
    if runtime_class and is_gpu_runtime_class(runtime_class, ctx):
        return True
    return bool(gpu_amounts(pod, ctx))
