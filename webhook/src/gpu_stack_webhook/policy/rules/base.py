"""What every rule gets, and the GPU facts several rules share."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.dra import ClaimSpec, claim_spec_of, extended_resource_class
from gpu_stack_webhook.policy.facts import OFFLINE, ClusterFacts
from gpu_stack_webhook.policy.pod import ContainerRef, PodView, parse_count
from gpu_stack_webhook.policy.sharing import NodeConfig, SharingIndex


class Signal(enum.Enum):
    """What in a request lets a rule act on it. Each rule module declares the signals it needs (SCOPE);
    a request with none of its rules' signals gets no finding and no change from any rule
    (tests/property/test_match_conditions.py), so the API server need not call the webhook for it: the
    webhook configurations' matchConditions are generated from the rules' SCOPE (cel/match_conditions.py)."""

    # A container names a GPU resource in requests or limits (any count), or the pod's runtimeClassName
    # is a GPU runtime class (is_gpu_pod); or the pod may hold GPUs by Dynamic Resource Allocation: it
    # names claims (spec.resourceClaims) or a container names a deviceclass.resource.kubernetes.io/
    # resource (names_dra: whether a claim holds a GPU needs a lookup, so any claim is in scope).
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
    # A resource.k8s.io ResourceClaim or ResourceClaimTemplate (GPU009): never a pod.
    DRA_OBJECT = "dra-object"


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
    NVIDIA_VISIBLE_DEVICES and the device list mounts select GPUs. A pod whose GPUs come by DRA counts."""
    return ctx.config.nvidia_runtime_is_default or is_gpu_pod(pod, ctx) or bool(dra_gpus(pod, ctx))


# --- GPUs from Dynamic Resource Allocation (policy/dra.py) ---------------------------------------------


def names_dra(pod: PodView) -> bool:
    """Does the pod name DRA claims or a deviceclass.resource.kubernetes.io/ resource (Signal.GPU_POD)?"""
    if pod.spec.get("resourceClaims"):
        return True
    return any(extended_resource_class(str(r)) for c in pod.containers() for r in (*c.requests, *c.limits))


class PodClaim:
    """One entry of the pod's spec.resourceClaims, resolved. `gpu`: its GPU request names (known), or
    None when the claim could not be read (`note` says why)."""

    __slots__ = ("gpu", "label", "mps", "name", "note")

    def __init__(self, name: str, label: str, gpu: frozenset[str] | None, mps: bool, note: str) -> None:
        self.name = name
        self.label = label  # claim "gpu" (ResourceClaimTemplate "one-gpu")
        self.gpu = gpu
        self.mps = mps  # an MPS sharing config applies to a GPU request
        self.note = note


def pod_claims(pod: PodView, ctx: Context) -> dict[str, PodClaim]:
    """spec.resourceClaims by name, each read through ctx.facts (memoized per pod)."""
    memo: tuple[ClusterFacts, dict[str, PodClaim]] | None = pod.memo.get(pod_claims)
    if memo is not None and memo[0] is ctx.facts:
        return memo[1]
    found: dict[str, PodClaim] = {}
    entries = pod.spec.get("resourceClaims")
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            found[entry["name"]] = _resolve_claim(entry, ctx)
    pod.memo[pod_claims] = (ctx.facts, found)
    return found


def _resolve_claim(entry: dict[str, Any], ctx: Context) -> PodClaim:
    name = str(entry["name"])
    claim, template = entry.get("resourceClaimName"), entry.get("resourceClaimTemplateName")
    kind, object_name = (("ResourceClaim", claim) if isinstance(claim, str) and claim
                         else ("ResourceClaimTemplate", template))
    label = f'claim "{name}" ({kind} "{object_name}")'
    if not isinstance(object_name, str) or not object_name:
        return PodClaim(name, f'claim "{name}"', frozenset(), False, "")  # the API server refuses it
    offline = "claims are not read without API lookups (webhook.lookups.enabled)"
    if not ctx.namespace:
        return PodClaim(name, label, None, False, offline)
    fact = (ctx.facts.resource_claim(ctx.namespace, object_name) if kind == "ResourceClaim"
            else ctx.facts.resource_claim_template(ctx.namespace, object_name))
    if not fact.known:
        return PodClaim(name, label, None, False, fact.note or offline)
    if fact.value is None:
        return PodClaim(name, label, None, False, f"{kind} {ctx.namespace}/{object_name} not found")
    spec: ClaimSpec = claim_spec_of(fact.value, kind)
    gpu = spec.gpu_request_names(ctx.config.dra)
    return PodClaim(name, label, gpu, spec.mps_for(ctx.config.dra), "")


def _container_claims(container: ContainerRef) -> list[tuple[str, str]]:
    """(claim name, request name or "") for each entry of the container's resources.claims."""
    resources = container.spec.get("resources")
    claims = resources.get("claims") if isinstance(resources, dict) else None
    out = []
    for ref in claims if isinstance(claims, list) else ():
        if isinstance(ref, dict) and isinstance(ref.get("name"), str):
            request = ref.get("request")
            out.append((ref["name"], request.split("/")[0] if isinstance(request, str) else ""))
    return out


def dra_gpus(pod: PodView, ctx: Context) -> dict[str, list[str]]:
    """Per container pointer, how it holds GPUs by DRA (known): 'claim "x" (ResourceClaim "y")' for a
    claim with a GPU request it references, or the deviceclass.resource.kubernetes.io/<GPU class> name
    with a count above 0. Empty for most pods (no claims, no such resource)."""
    memo: tuple[ClusterFacts, dict[str, list[str]]] | None = pod.memo.get(dra_gpus)
    if memo is not None and memo[0] is ctx.facts:
        return memo[1]
    out: dict[str, list[str]] = {}
    if names_dra(pod):
        claims = pod_claims(pod, ctx)
        dra = ctx.config.dra
        for container in pod.containers():
            held = []
            for resource in {**container.requests, **container.limits}:
                device_class = extended_resource_class(str(resource))
                value = container.limits.get(resource, container.requests.get(resource))
                count = parse_count(value)
                if dra.is_gpu_class(device_class) and count is not None and count > 0:
                    held.append(str(resource))
            for name, request in _container_claims(container):
                claim = claims.get(name)
                if claim is not None and claim.gpu and (not request or request in claim.gpu):
                    held.append(claim.label)
            if held:
                out[container.pointer] = held
    pod.memo[dra_gpus] = (ctx.facts, out)
    return out


def unresolved_claims(pod: PodView, ctx: Context) -> dict[str, list[PodClaim]]:
    """Per container pointer, the claims it references that could not be read (they may hold GPUs)."""
    out: dict[str, list[PodClaim]] = {}
    if not pod.spec.get("resourceClaims"):
        return out
    claims = pod_claims(pod, ctx)
    for container in pod.containers():
        for name, _ in _container_claims(container):
            claim = claims.get(name)
            if claim is not None and claim.gpu is None:
                out.setdefault(container.pointer, []).append(claim)
    return out


def unresolved_note(claims: Iterable[PodClaim]) -> str:
    """'claim "x" (ResourceClaim "y"): API unreachable' for a message."""
    return "; ".join(dict.fromkeys(f"{c.label}: {c.note}" for c in claims))
