"""GPU003 no-privileged-gpu-containers: no privileged or CAP_SYS_ADMIN container in a GPU pod (SYS_ADMIN: own GPU ok).

Scope, exactly (what a CEL port must reproduce):

* A GPU pod: any container (of the three kinds) names a GPU resource in requests or limits, with
  any count, 0 included; or `spec.runtimeClassName` is one of `gpuRuntimeClassNames`.
* In a GPU pod, every container (containers, initContainers, ephemeralContainers) with
  `securityContext.privileged: true` is denied: it sees every device node on the host.
* In a GPU pod, every container whose `securityContext.capabilities.add` holds `SYS_ADMIN` or `ALL`
  is denied unless it has its own GPU allocation. Spellings: any case, surrounding blanks ignored,
  with or without the `CAP_` prefix (`sys_admin`, `CAP_SYS_ADMIN`, `all`, `cap_all`). `drop` never
  excuses an `add` (runtimes order add and drop differently); `drop: [ALL]` alone is fine, and so is
  any other added capability (NET_ADMIN, NET_RAW for mesh init containers, SYS_PTRACE...).
* Own GPU allocation: the container itself names a GPU resource with a count above 0 (limit, else
  request), and every device plugin config the pod could run under passes the device list in a way
  that overrides the image environment (deviceListStrategy envvar, volume-mounts or cdi-annotations;
  not cdi-cri alone). Ephemeral containers cannot have resources, so a `kubectl debug` container with
  SYS_ADMIN in a GPU pod is always denied.

GPUs from Dynamic Resource Allocation count the same way (policy/dra.py dra_gpus): a pod holds GPUs
when a container references a claim (spec.resourceClaims, a ResourceClaim or ResourceClaimTemplate in
the pod's namespace) with a request for a GPU DeviceClass (policy dra.gpuDeviceClasses), or names
`deviceclass.resource.kubernetes.io/<GPU class>`; a container's own GPU is then such a claim or
resource of its own. containerd gives a privileged container every device node of the host, and the
claim's CDI edits bring the driver libraries. A claim the webhook cannot read (lookups off, API down,
no permission, not created yet) in a pod with a privileged or SYS_ADMIN container is denied under
`dra.unresolvedClaims: deny` (the default, fail closed) and warned about under `warn`; the message says
which claim and why it could not be read.

Why (nvidia-container-toolkit v1.20, internal/config/image/privileged.go and cuda_image.go): the
runtime counts a container as privileged when CAP_SYS_ADMIN is in its bounding set (`privileged:
true`, `add: [SYS_ADMIN]` or `add: [ALL]` all put it there) and then honours the image's device
environment even with accept-nvidia-visible-devices-envvar-when-unprivileged=false. Every CUDA image
bakes in NVIDIA_VISIBLE_DEVICES=all, an image with CUDA_VERSION and no NVIDIA_REQUIRE_CUDA defaults
to all GPUs as a "legacy" image, and NVIDIA_MIG_CONFIG_DEVICES / NVIDIA_MIG_MONITOR_DEVICES /
NVIDIA_IMEX_CHANNELS are honoured the same way, none of it visible in the pod spec. A container with
its own allocation gets the device plugin's list (volume mounts, its NVIDIA_VISIBLE_DEVICES or CDI
annotations), which takes precedence over the image environment, so a profiler with SYS_ADMIN and
`nvidia.com/gpu: 1` (dcgmproftester, Nsight) sees only its GPU.
"""

from __future__ import annotations

from typing import Any

from gpu_stack_webhook.policy.cel_twin import (
    ALLOCATED,
    CANDIDATES,
    DRA_HELD,
    DRA_NAMES,
    GPU_AMOUNTS,
    GPU_POD,
    CelValidation,
    Message,
    finding_text,
)
from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.dra import dra_gpus, unresolved_claims, unresolved_note
from gpu_stack_webhook.policy.findings import Finding, Severity
from gpu_stack_webhook.policy.gpus import allocated_gpus, candidate_configs, is_gpu_pod
from gpu_stack_webhook.policy.pod import ContainerRef, PodView
from gpu_stack_webhook.policy.signals import Signal

ID = "GPU003"
NAME = "no-privileged-gpu-containers"
# The rule's row of docs/policy-rules.md (markdown; `make generate` writes the table).
DOC = (
    'in a GPU pod (any container names a GPU resource, even with 0, or `runtimeClassName` is a GPU runtime '
    'class): no `privileged: true` container of any kind, and no container adding `SYS_ADMIN` or `ALL` (any '
    'case, with or without `CAP_`) unless it has a GPU of its own. See [GPU003 in detail](#gpu003-in-detail)'
)
SCOPE = (Signal.GPU_POD,)  # policy/signals.py
# What stays webhook-only, and why (rules/__init__.py).
WEBHOOK_ONLY = "a pod's claims (spec.resourceClaims: a lookup) and claims that cannot be read (dra.unresolvedClaims)"
MUTATING = False  # denies and warns on /validate only (rules/__init__.py)
# Capabilities that put CAP_SYS_ADMIN in the bounding set, in canonical spelling.
SYS_ADMIN_GRANTING = frozenset({"SYS_ADMIN", "ALL"})
IN_GPU_POD = "a GPU pod"
HOLDING_BY_DRA = Message("a pod holding GPUs by {names}")
PRIVILEGED = Message("{label} is privileged in {held} and would see every GPU on the node; remove "
                     "securityContext.privileged")
SYS_ADMIN = Message("{label} adds capability {capability} in {held} without a GPU of its own; the NVIDIA runtime "
                    "treats CAP_SYS_ADMIN as privileged and gives it every GPU its image asks for "
                    "(NVIDIA_VISIBLE_DEVICES=all in CUDA images); drop {capability} or give the container its own "
                    "GPU request")


def canonical_capability(name: Any) -> str:
    """`cap_sys_admin ` -> `SYS_ADMIN`: how containerd and CRI-O read a capability name."""
    if not isinstance(name, str):
        return ""
    upper = name.strip().upper()
    return upper[4:] if upper.startswith("CAP_") else upper


def added_sys_admin(container: ContainerRef) -> tuple[int, str] | None:
    """(index, spelling) of the first `capabilities.add` entry that grants CAP_SYS_ADMIN."""
    capabilities = container.security_context.get("capabilities")
    added = capabilities.get("add") if isinstance(capabilities, dict) else None
    for index, name in enumerate(added if isinstance(added, list) else ()):
        if canonical_capability(name) in SYS_ADMIN_GRANTING:
            return index, str(name)
    return None


def check(pod: PodView, ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    privileged: list[ContainerRef] = []
    sys_admin: list[tuple[ContainerRef, tuple[int, str]]] = []
    for c in pod.containers():
        if not c.security_context:  # most containers
            continue
        if c.security_context.get("privileged") is True:
            privileged.append(c)
        if (found := added_sys_admin(c)) is not None:
            sys_admin.append((c, found))
    if not (privileged or sys_admin):
        return findings
    gpu_pod = is_gpu_pod(pod, ctx)
    dra = dra_gpus(pod, ctx)
    unresolved = unresolved_claims(pod, ctx)
    if not (gpu_pod or dra or unresolved):
        return findings
    # How the pod holds GPUs, for the messages: "a GPU pod", or the claims by DRA.
    held = IN_GPU_POD if gpu_pod or not dra else HOLDING_BY_DRA(
        names=", ".join(dict.fromkeys(d for ds in dra.values() for d in ds)))
    known = gpu_pod or bool(dra)
    uncertain = Severity.DENY if ctx.config.dra.unresolved_claims == "deny" else Severity.WARN
    for container in privileged:
        if known:
            findings.append(Finding(ID, Severity.DENY, PRIVILEGED(label=container.label, held=held),
                                    f"{container.path}.securityContext.privileged"))
        else:
            findings.append(_uncertain(container, "is privileged", unresolved, uncertain,
                                       f"{container.path}.securityContext.privileged"))
    own: dict[str, Any] = dict(dra)
    if all(c.list_overrides_image_env for c in candidate_configs(pod, ctx)):
        own.update(allocated_gpus(pod, ctx))
    privileged_pointers = {c.pointer for c in privileged}
    for container, (index, spelling) in sys_admin:
        if container.pointer in own or container.pointer in privileged_pointers:
            continue
        path = f"{container.path}.securityContext.capabilities.add[{index}]"
        if not known or container.pointer in unresolved:
            findings.append(_uncertain(container, f"adds capability {spelling}", unresolved, uncertain, path))
            continue
        findings.append(Finding(ID, Severity.DENY, SYS_ADMIN(label=container.label, capability=spelling, held=held),
                                path))
    return findings


def _uncertain(container: ContainerRef, what: str, unresolved: dict[str, list[Any]], severity: Severity,
               path: str) -> Finding:
    """A container that would be denied if a claim the webhook cannot read holds a GPU."""
    claims = [c for cs in unresolved.values() for c in cs]
    return Finding(
        ID,
        severity,
        f"{container.label} {what} and the pod's GPU claims could not be read ({unresolved_note(claims)}); "
        f"if a claim holds a GPU the container would see every GPU on the node: remove it, or let the "
        f"webhook read resourceclaims (policy dra.unresolvedClaims)",
        path,
    )


# --- The CEL twin ----------------------------------------------------------------------------------------
# The privileged and SYS_ADMIN containers of a pod whose GPUs CEL can see; a pod's claims need a lookup.
_PRIVILEGED = "e.c.?securityContext.?privileged.orValue(false) == true"
_GRANTING = sorted(SYS_ADMIN_GRANTING)
# The index of the first capabilities.add entry that grants CAP_SYS_ADMIN (privileged.canonical_capability).
_SYS_ADMIN_AT = (
    "cel.bind(add, e.c.?securityContext.?capabilities.?add.orValue([]), lists.range(size(add)).filter(k, "
    "cel.bind(u, string(add[k]).trim().upperAscii(), (u.startsWith('CAP_') ? u.substring(4) : u) in "
    f"{_GRANTING!r})))"
)
_OWN_GPU = ("variables.draHeld.exists(h, h.path == e.path) || "
            "variables.candidateConfigs.all(n, n in variables.overridingConfigs) && e.path in variables.allocatedPaths")
# "a GPU pod", or the DRA resources the pod holds GPUs by.
_HELD = (f"({GPU_POD} || size(variables.draHeld) == 0 ? '{IN_GPU_POD}' : "
         f"{HOLDING_BY_DRA.cel(names='variables.draNames')})")
_GPU003_PRIVILEGED = (
    f"variables.containers.filter(e, {_PRIVILEGED}).map(e, "
    + finding_text(ID, PRIVILEGED.cel(label="e.label", held=_HELD), "e.path + '.securityContext.privileged'")
    + ")"
)
_SYS_ADMIN_TEXT = finding_text(ID, SYS_ADMIN.cel(label="e.label", capability="c", held=_HELD),
                               "e.path + '.securityContext.capabilities.add[' + string(k) + ']'")
_GPU003_SYS_ADMIN = (
    f"variables.containers.filter(e, !({_PRIVILEGED}) && !({_OWN_GPU}) && size({_SYS_ADMIN_AT}) > 0).map(e, "
    f"cel.bind(k, {_SYS_ADMIN_AT}[0], cel.bind(c, string(e.c.securityContext.capabilities.add[k]), "
    f"{_SYS_ADMIN_TEXT})))"
)
CEL_VALIDATION = CelValidation(ID, NAME, (
    "gpuNames", "gpuPrefixes", "gpuRuntimeClassNames", "configLabel", "configNames", "defaultConfig",
    "overridingConfigs", "draGpuClasses"), (
    GPU_AMOUNTS, ALLOCATED, CANDIDATES, DRA_HELD, DRA_NAMES,
    ("violations", f"{GPU_POD} || size(variables.draHeld) > 0 ? {_GPU003_PRIVILEGED} + {_GPU003_SYS_ADMIN} : []"),
))
