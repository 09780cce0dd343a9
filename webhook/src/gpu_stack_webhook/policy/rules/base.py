"""What every rule gets, and the GPU facts several rules share."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.facts import OFFLINE, ClusterFacts
from gpu_stack_webhook.policy.pod import ContainerRef, PodView, parse_count
from gpu_stack_webhook.policy.sharing import NodeConfig, SharingIndex


class Signal(enum.Enum):
    """What in a request lets a rule act on it. Each rule module declares the signals it needs (SCOPE);
    a request with none of its rules' signals gets no finding and no change from any rule
    (tests/property/test_match_conditions.py), so the API server need not call the webhook for it: the
    webhook configurations' matchConditions are generated from the rules' SCOPE (cel/match_conditions.py)."""

    # A container names a GPU resource in requests or limits (any count), or the pod's runtimeClassName
    # is a GPU runtime class (is_gpu_pod).
    GPU_POD = "gpu-pod"
    # The pod runs under the NVIDIA runtime (a GPU pod, or any pod where that runtime is the node's
    # default: config nvidiaRuntimeIsDefault) and names something that runtime reads from a pod spec:
    # NVIDIA_VISIBLE_DEVICES in env, an envFrom source, a mount under its device list directory. A GPU
    # pod always carries it (scope.py).
    NVIDIA_RUNTIME = "nvidia-runtime"
    # The MPS opt-in annotation, or a nodeSelector / required node affinity on an MPS label or on the
    # device plugin config label (mps.mps_selection).
    MPS_SELECTION = "mps-selection"
    # An annotation under cdi.k8s.io/, which containerd and CRI-O read under any runtime.
    CDI_ANNOTATION = "cdi-annotation"


@dataclass(frozen=True)
class Context:
    config: PolicyConfig
    sharing: SharingIndex = field(compare=False)
    # True only for a Pod being created through /mutate: the one case where rules may emit patches.
    can_patch: bool = False
    # What the cluster says (facts.py); offline unless the webhook runs with API lookups.
    facts: ClusterFacts = field(default=OFFLINE, compare=False)
    # The namespace of the object under review ("" offline: rules then never ask `facts`).
    namespace: str = ""

    @classmethod
    def for_config(cls, config: PolicyConfig, *, can_patch: bool = False) -> Context:
        return cls(config=config, sharing=SharingIndex(config), can_patch=can_patch)


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
    """A pod that requests any GPU resource in any container, or runs with a GPU runtime class."""
    if pod.spec.get("runtimeClassName") in ctx.config.gpu_runtime_class_names:
        return True
    return bool(gpu_amounts(pod, ctx))


def reaches_nvidia_runtime(pod: PodView, ctx: Context) -> bool:
    """Does the pod run under the NVIDIA runtime (Signal.NVIDIA_RUNTIME)? Only there do
    NVIDIA_VISIBLE_DEVICES and the device list mounts select GPUs."""
    return ctx.config.nvidia_runtime_is_default or is_gpu_pod(pod, ctx)
