"""GPU006 mps-pod-injection: MPS pods get what they need to reach the MPS control daemon.

A pod is an MPS pod when it requests a resource that every config it could land on shares through
MPS, when its nodeSelector or required node affinity selects MPS nodes (the configured MPS labels,
or the device plugin config label naming an MPS config), or when it carries the opt-in annotation
`gpu-stack.io/mps: "true"`. For a Pod being created the mutating pass adds `hostIPC: true` (when
`mps.injectHostIPC` is on), each configured MPS toleration that is missing, and for an annotation
opt-in the MPS node selector. Each change is a warning that says why. Every change checks what is
already there first, so a reinvoked webhook adds nothing twice.

With API lookups (ctx.facts online) the namespace's enforced Pod Security level is read first: where
`baseline` or `restricted` forbids hostIPC, adding it would only get the pod rejected by PodSecurity
with a message about hostIPC the user never set. Then `mps.podSecurityConflict: deny` denies the pod
(and, on /validate, a workload whose pods would be) saying why and what to change; `skip` leaves
hostIPC out with a warning. When the level cannot be read the offline behaviour applies and the
change's warning says that Pod Security was not checked.

A pod whose GPUs come only by DRA claims with an MPS sharing config (GpuConfig sharing.strategy MPS)
gets none of this: the NVIDIA DRA driver runs an MPS control daemon per claim and mounts its pipe and
shm directories into the pod, so hostIPC and the MPS node taint's toleration are not needed; a warning
says so instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpu_stack_webhook.policy.cel_twin import CANDIDATES, GPU_AMOUNTS, CelMutation, add_map, patch_op
from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.dra import pod_claims
from gpu_stack_webhook.policy.facts import FORBID_HOST_IPC
from gpu_stack_webhook.policy.findings import Finding, Severity
from gpu_stack_webhook.policy.gpus import candidate_configs, gpu_amounts
from gpu_stack_webhook.policy.pod import PodView
from gpu_stack_webhook.policy.sharing import Strategy
from gpu_stack_webhook.policy.signals import Signal, mps_selection

ID = "GPU006"
NAME = "mps-pod-injection"
# The rule's row of docs/policy-rules.md (markdown; `make generate` writes the table).
DOC = (
    'MPS pods (MPS-shared resource, MPS node selector/affinity, or the `gpu-stack.io/mps: "true"` '
    'annotation) get `hostIPC: true` (switchable), the missing MPS tolerations, and for annotation opt-in '
    'the MPS node selector — each change reported as a warning'
)
SCOPE = (Signal.GPU_RESOURCES, Signal.MPS_SELECTION)
# What stays webhook-only, and why (rules/__init__.py).
WEBHOOK_ONLY = ("the denials (Pod Security levels need a lookup; an opt-in whose nodeSelector excludes MPS nodes is "
                "left unpatched), the warnings, and leaving pods with DRA MPS claims alone (a lookup)")


def mps_reason(pod: PodView, ctx: Context) -> str | None:
    """Why this pod is an MPS pod, or None."""
    selection = mps_selection(pod, ctx)
    if selection is not None:
        return selection
    if not ctx.sharing.mps_config_names:  # no config shares anything through MPS
        return None
    candidates = candidate_configs(pod, ctx)
    for amount in gpu_amounts(pod, ctx):
        # Every config that exposes the resource shares it through MPS.
        if {r.strategy for c in candidates if (r := c.lookup(amount.resource)) is not None} == {Strategy.MPS}:
            return f"{amount.resource} is MPS-shared"
    return None


def _normalized(toleration: Any) -> tuple[str, str, str, str]:
    t = toleration if isinstance(toleration, dict) else {}
    return (str(t.get("key") or ""), str(t.get("operator") or "Equal"), str(t.get("value") or ""),
            str(t.get("effect") or ""))


def _covers(have: tuple[str, str, str, str], want: tuple[str, str, str, str]) -> bool:
    """Does toleration `have` tolerate every taint that `want` tolerates?"""
    have_key, have_op, have_value, have_effect = have
    want_key, want_op, want_value, want_effect = want
    if have_effect and have_effect != want_effect:
        return False
    if have_op == "Exists":
        return have_key in ("", want_key)
    return have_key == want_key and want_op == "Equal" and have_value == want_value


def _tolerated(wanted: dict[str, Any], existing: list[tuple[str, str, str, str]]) -> bool:
    want = _normalized(wanted)
    return any(_covers(have, want) for have in existing)


def check(pod: PodView, ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    reason = mps_reason(pod, ctx)
    if reason is None:
        return findings
    if pod.spec.get("resourceClaims") and not gpu_amounts(pod, ctx):
        dra_mps = [c.label for c in pod_claims(pod, ctx).values() if c.mps]
        if dra_mps:
            findings.append(Finding(
                ID, Severity.WARN,
                f"no hostIPC/MPS tolerations for MPS by DRA: the driver runs a daemon per claim and mounts its "
                f"pipe and shm ({reason}; {', '.join(dra_mps)})", pod.path, on_mutate=True))
            return findings
    mps = ctx.config.mps
    opted_in = reason.startswith("annotation")
    conflict = _selector_conflict(pod, ctx, reason) if opted_in else None
    if conflict:
        findings.append(conflict)
        return findings
    wants_host_ipc = mps.inject_host_ipc and pod.spec.get("hostIPC") is not True
    level, unchecked = _pod_security(ctx) if wants_host_ipc else ("", "")
    if level and mps.pod_security_conflict == "deny" and (ctx.can_patch or pod.is_template):
        findings.append(Finding(
            ID,
            Severity.DENY,
            f'MPS pods ({reason}) get hostIPC, which Pod Security "{level}" enforced in namespace {ctx.namespace} '
            f"forbids, so the pod would be rejected; label the namespace pod-security.kubernetes.io/enforce="
            f"privileged, or set the webhook policy mps.injectHostIPC=false (NVIDIA MPS does not need hostIPC)",
            f"{pod.path}.hostIPC",
            deny_early=True,
        ))
        return findings
    if not ctx.can_patch:
        if pod.is_template:
            findings.append(
                Finding(ID, Severity.WARN, f"MPS pods ({reason}): hostIPC/tolerations get added per pod", pod.path)
            )
        return findings
    if wants_host_ipc and level:
        findings.append(Finding(ID, Severity.WARN,
                                f'hostIPC not added for MPS: namespace enforces Pod Security "{level}"',
                                f"{pod.path}.hostIPC", on_mutate=True))
    elif wants_host_ipc:
        pod.desired.edit(pod.pointer)["hostIPC"] = True
        findings.append(Finding(
            ID,
            Severity.WARN,
            f"hostIPC=true for MPS ({reason}); Pod Security unchecked: {unchecked}" if unchecked
            else f"hostIPC=true for MPS ({reason}); off: mps.injectHostIPC",
            f"{pod.path}.hostIPC",
            changed=True,
        ))
    existing = pod.tolerations
    have = [_normalized(t) for t in existing]
    missing = [t.as_k8s() for t in mps.tolerations if not _tolerated(t.k8s, have)]
    if missing:
        pod.desired.edit(pod.pointer)["tolerations"] = [*existing, *missing]
        keys = ", ".join(str(t.get("key", "*")) for t in missing)
        findings.append(Finding(ID, Severity.WARN, f"added MPS toleration {keys} ({reason})",
                                f"{pod.path}.tolerations", changed=True))
    if opted_in:
        findings.extend(_inject_node_selector(pod, ctx, reason))
    return findings


def _selector_conflict(pod: PodView, ctx: Context, reason: str) -> Finding | None:
    current = pod.node_selector
    for key, value in ctx.config.mps.node_selector.items():
        if key in current and str(current[key]) != value:
            return Finding(
                ID,
                Severity.DENY,
                f'opts in to MPS ({reason}) but nodeSelector {key}="{current[key]}" excludes MPS nodes '
                f'({key}="{value}"); remove one of them',
                f"{pod.path}.nodeSelector",
                deny_early=True,
            )
    return None


def _inject_node_selector(pod: PodView, ctx: Context, reason: str) -> Iterator[Finding]:
    current = pod.node_selector
    wanted = ctx.config.mps.node_selector
    missing = {k: v for k, v in wanted.items() if k not in current}
    if not missing:
        return
    pod.desired.edit(pod.pointer)["nodeSelector"] = {**current, **missing}
    labels = ", ".join(f"{k}={v}" for k, v in missing.items())
    yield Finding(ID, Severity.WARN, f"added nodeSelector {labels} ({reason})", f"{pod.path}.nodeSelector",
                  changed=True)


def _pod_security(ctx: Context) -> tuple[str, str]:
    """(the enforced level when it forbids hostIPC, else ""; why it is unknown, "" when known or offline)."""
    if not (ctx.facts.online and ctx.namespace):
        return "", ""
    fact = ctx.facts.pod_security_enforce(ctx.namespace)
    if not fact.known:
        return "", fact.note or "unknown"
    level = str(fact.value or "")
    return (level if level in FORBID_HOST_IPC else ""), ""


# --- The CEL twin ----------------------------------------------------------------------------------------
# The injection on Pods being created, an MPS pod recognised as mps_reason does. Webhook only: the denials
# (an opt-in whose nodeSelector excludes MPS nodes is left unpatched; Pod Security needs a lookup), the
# warnings, and leaving pods with DRA MPS claims alone (a lookup of the claims).
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


def _normalized_cel(t: str) -> str:
    """A toleration as [key, operator, value, effect] with the webhook's defaults (_normalized above)."""
    return (f"[{t}.?key.orValue(''), {t}.?operator.orValue('') == '' ? 'Equal' : {t}.operator, "
            f"{t}.?value.orValue(''), {t}.?effect.orValue('')]")


# _covers above: does toleration h tolerate every taint w tolerates?
_COVERS = ("(h[3] == '' || h[3] == w[3]) && (h[1] == 'Exists' ? h[0] in ['', w[0]] : "
           "h[0] == w[0] && w[1] == 'Equal' && h[2] == w[2])")
_MISSING_TOLERATIONS = (
    "variables.mpsTolerations.filter(want, cel.bind(w, " + _normalized_cel("want") + ", "
    "!variables.podSpec.?tolerations.orValue([]).exists(have, cel.bind(h, " + _normalized_cel("have") + ", "
    + _COVERS + "))))"
)
_MPS_PATCH = (
    "(variables.injectHostIPC && variables.podSpec.?hostIPC.orValue(false) != true ? "
    f"[{patch_op(repr('/spec/hostIPC'), 'true')}] : []) + "
    "(has(variables.podSpec.tolerations) ? variables.missingTolerations.map(t, "
    f"{patch_op(repr('/spec/tolerations/-'), 't')}) : size(variables.missingTolerations) > 0 ? "
    f"[{patch_op(repr('/spec/tolerations'), 'variables.missingTolerations')}] : []) + "
    "(variables.optedIn ? " + add_map(
        "has(variables.podSpec.nodeSelector)", "'/spec/nodeSelector'",
        "variables.mpsNodeSelector.filter(k, !(k in variables.podSpec.?nodeSelector.orValue({})))"
        ".map(k, [dyn(k), dyn(variables.mpsNodeSelector[k])])") + " : [])"
)
CEL_MUTATION = CelMutation(
    ID, NAME,
    ("gpuNames", "gpuPrefixes", "configLabel", "configNames", "defaultConfig", "exposed", "replaced",
     "mixedMigConfigs", "mpsConfigNames", "mpsAnnotation", "mpsNodeSelector", "mpsTolerations", "injectHostIPC"),
    (GPU_AMOUNTS, CANDIDATES,
     ("optedIn", _OPTED_IN),
     ("isMpsPod", f"variables.optedIn || {_BY_SELECTOR} || {_BY_AFFINITY} || {_BY_RESOURCE}"),
     ("missingTolerations", _MISSING_TOLERATIONS)),
    f"!variables.isMpsPod || (variables.optedIn && {_CONFLICT}) ? [] : {_MPS_PATCH}",
)
