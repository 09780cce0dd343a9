"""GPUs from Dynamic Resource Allocation (resource.k8s.io/v1), read from a ResourceClaim spec: which of
its requests ask for a GPU DeviceClass (policy dra.gpuDeviceClasses), and what the NVIDIA driver's opaque
config says about sharing. Pure: no I/O; the claim spec comes from the request (GPU009), from
`ctx.facts` (a pod's claims: pod_claims below) or from the other documents of `check`'s input. Then
the GPUs a pod holds by DRA: its claims resolved (pod_claims), the GPUs each container holds
(dra_gpus), and the claims that could not be read (unresolved_claims).

Upstream facts (kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1, the newest tag of the snapshot we could
read; tests/webhook/test_dra_upstream.py cites each file): the driver is `gpu.nvidia.com`; its opaque
config is `{apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig | MigDeviceConfig, sharing:
{strategy: TimeSlicing | MPS, timeSlicingConfig, mpsConfig: {defaultActiveThreadPercentage,
defaultPinnedDeviceMemoryLimit, defaultPerDevicePinnedMemoryLimit}}}`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from gpu_stack_webhook.policy.config import DRA_SHARING_STRATEGIES, DraPolicy
from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.facts import ClusterFacts
from gpu_stack_webhook.policy.pod import ContainerRef, PodView, parse_count
from gpu_stack_webhook.policy.quantity import parse_quantity

DRIVER = "gpu.nvidia.com"
CONFIG_API_VERSION = "resource.nvidia.com/v1beta1"
SHARING_KINDS = ("GpuConfig", "MigDeviceConfig")
# KEP-5004 DRAExtendedResource: a container asking for deviceclass.resource.kubernetes.io/<class> gets a
# device of that DeviceClass through a claim the scheduler makes.
EXTENDED_RESOURCE_PREFIX: Final = "deviceclass.resource.kubernetes.io/"  # Final: compiled, a constant (engine.py)
MPS = "MPS"
# What is wrong with an NVIDIA opaque config the driver could not read (ClaimSpec.problems; GPU009's CEL twin
# gives the same texts).
NOT_AN_OBJECT = f"parameters of driver {DRIVER} are not an object"
WRONG_API_VERSION = f"apiVersion is not {CONFIG_API_VERSION}"
SHARING_NOT_AN_OBJECT = "sharing is not an object"
UNKNOWN_STRATEGY = f"sharing.strategy is not {' or '.join(DRA_SHARING_STRATEGIES)}"
MPS_CONFIG_NOT_AN_OBJECT = "mpsConfig is not an object"
LIMIT_NOT_A_QUANTITY = "defaultPinnedDeviceMemoryLimit is not a quantity"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


class DeviceRequest:
    """One request of a claim (for `firstAvailable`, one per alternative; `name` is the request's)."""

    __slots__ = ("admin_access", "all_devices", "device_class", "name", "path")

    def __init__(self, name: str, device_class: Any, all_devices: bool, admin_access: bool, path: str) -> None:
        self.name = name
        self.device_class = device_class
        self.all_devices = all_devices
        self.admin_access = admin_access
        self.path = path


class SharingConfig:
    """The `sharing` of an NVIDIA opaque config entry of a claim."""

    __slots__ = ("has_memory_limit", "path", "requests", "strategy")

    def __init__(self, strategy: str, has_memory_limit: bool, requests: tuple[str, ...], path: str) -> None:
        self.strategy = strategy
        self.has_memory_limit = has_memory_limit
        self.requests = requests  # () applies to every request
        self.path = path  # of the config entry's `opaque.parameters`


class ClaimSpec:
    """A ResourceClaimSpec as the policy reads it. `path`: where it sits ("spec", or "spec.spec" in a
    template)."""

    __slots__ = ("problems", "requests", "sharing")

    def __init__(self, spec: Any, path: str = "spec") -> None:
        devices = _dict(_dict(spec).get("devices"))
        self.requests: list[DeviceRequest] = []
        for i, item in enumerate(_list(devices.get("requests"))):
            request = _dict(item)
            name = str(request.get("name") or "")
            at = f"{path}.devices.requests[{i}]"
            exactly = request.get("exactly")
            if isinstance(exactly, dict):
                self.requests.append(_device_request(name, exactly, f"{at}.exactly"))
            for j, alternative in enumerate(_list(request.get("firstAvailable"))):
                self.requests.append(_device_request(name, _dict(alternative), f"{at}.firstAvailable[{j}]"))
        self.sharing: list[SharingConfig] = []
        # (path, what is wrong) for an NVIDIA opaque config the driver would refuse.
        self.problems: list[tuple[str, str]] = []
        for i, entry in enumerate(_list(devices.get("config"))):
            self._read_config(_dict(entry), f"{path}.devices.config[{i}]")

    def _read_config(self, entry: dict[str, Any], at: str) -> None:
        opaque = _dict(entry.get("opaque"))
        if opaque.get("driver") != DRIVER:
            return
        at = f"{at}.opaque.parameters"
        parameters = opaque.get("parameters")
        if not isinstance(parameters, dict):
            self.problems.append((at, NOT_AN_OBJECT))
            return
        kind = parameters.get("kind")
        if parameters.get("apiVersion") != CONFIG_API_VERSION:
            self.problems.append((f"{at}.apiVersion", WRONG_API_VERSION))
            return
        if kind not in SHARING_KINDS:
            return  # VfioDeviceConfig, ComputeDomain configs: no sharing to judge
        sharing = parameters.get("sharing")
        if sharing is None:
            return
        if not isinstance(sharing, dict):
            self.problems.append((f"{at}.sharing", SHARING_NOT_AN_OBJECT))
            return
        strategy = sharing.get("strategy")
        if strategy not in DRA_SHARING_STRATEGIES:
            self.problems.append((f"{at}.sharing.strategy", UNKNOWN_STRATEGY))
            return
        mps = sharing.get("mpsConfig")
        if mps is not None and not isinstance(mps, dict):
            self.problems.append((f"{at}.sharing.mpsConfig", MPS_CONFIG_NOT_AN_OBJECT))
            return
        limit = _dict(mps).get("defaultPinnedDeviceMemoryLimit")
        if limit is not None and not _is_quantity(limit):
            self.problems.append((f"{at}.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit", LIMIT_NOT_A_QUANTITY))
            return
        requests = tuple(str(r) for r in _list(entry.get("requests")))
        self.sharing.append(SharingConfig(str(strategy), limit is not None, requests, at))

    def gpu_requests(self, dra: DraPolicy) -> list[DeviceRequest]:
        """The requests (alternatives) that name a GPU DeviceClass."""
        return [r for r in self.requests if dra.is_gpu_class(r.device_class)]

    def gpu_request_names(self, dra: DraPolicy) -> frozenset[str]:
        return frozenset(r.name for r in self.gpu_requests(dra))

    def applies(self, sharing: SharingConfig, request: str) -> bool:
        return not sharing.requests or request in sharing.requests

    def mps_for(self, dra: DraPolicy, request: str | None = None) -> bool:
        """Does an MPS config apply to a GPU request (`request`, or any)?"""
        names = self.gpu_request_names(dra)
        wanted = names if request is None else names & {request}
        return any(s.strategy == MPS and any(self.applies(s, n) for n in wanted) for s in self.sharing)


def _device_request(name: str, spec: dict[str, Any], path: str) -> DeviceRequest:
    return DeviceRequest(name, spec.get("deviceClassName"), spec.get("allocationMode") == "All",
                         spec.get("adminAccess") is True, path)


def _is_quantity(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, str | int):
        return False
    try:
        return parse_quantity(value).is_finite()
    except (ValueError, ArithmeticError):
        return False


def claim_spec_of(obj: Any, kind: str) -> ClaimSpec:
    """The ClaimSpec of a ResourceClaim (spec) or a ResourceClaimTemplate (spec.spec)."""
    spec = _dict(_dict(obj).get("spec"))
    if kind == "ResourceClaimTemplate":
        return ClaimSpec(spec.get("spec"), "spec.spec")
    return ClaimSpec(spec, "spec")


def extended_resource_class(resource: str) -> str:
    """deviceclass.resource.kubernetes.io/gpu.nvidia.com -> gpu.nvidia.com; "" for any other name."""
    return resource[len(EXTENDED_RESOURCE_PREFIX):] if resource.startswith(EXTENDED_RESOURCE_PREFIX) else ""


# --- The GPUs a pod holds by DRA -------------------------------------------------------------------------


def names_dra(pod: PodView) -> bool:
    """Does the pod name DRA claims or a deviceclass.resource.kubernetes.io/ resource (Signal.GPU_RESOURCES)?
    Memoized per pod: the scope gate and several rules ask, and most pods name neither."""
    memo: bool | None = pod.memo.get(names_dra)
    if memo is not None:
        return memo
    found = bool(pod.spec.get("resourceClaims")) or any(
        _names_device_class(c.requests) or _names_device_class(c.limits) for c in pod.containers())
    pod.memo[names_dra] = found
    return found


def _names_device_class(resources: dict[str, Any]) -> bool:
    return any(isinstance(resource, str) and extended_resource_class(resource) for resource in resources)


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
    # A claim that could not be read is asked again by each rule (from the lookups' cache, no request): so each rule
    # that cannot be applied is the one that asks, and is named in the lookups' log line (kube/lookups.py).
    if all(claim.gpu is not None for claim in found.values()):
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
            # By name, as the CEL twin (cel_twin.DRA_HELD) must: a CEL map's keys come in no set order.
            for resource in sorted({**container.requests, **container.limits}, key=str):
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
