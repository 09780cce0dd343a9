"""GPU002 no-nvidia-visible-devices: no container of any pod sets NVIDIA_VISIBLE_DEVICES.

The NVIDIA container runtime hands a container every GPU this variable names, whatever the device
plugin allocated, so it is forbidden in every pod that runs under that runtime: as an `env` entry
(value or valueFrom), or through an `envFrom` prefix that could produce the name. Where the NVIDIA
runtime is the node's default runtime (policy nvidiaRuntimeIsDefault: the chart's default-runtime and
preinstalled layouts) that is every pod, GPU or not; elsewhere (runtime-class and cdi layouts) only
GPU pods reach it (a GPU resource or a GPU runtime class): any other pod runs under runc, which reads
no NVIDIA variable, so its environment and its envFrom ConfigMaps cannot select a GPU. An `envFrom` without a
prefix imports whatever keys its ConfigMap or Secret holds, which cannot be seen offline: a warning.
With API lookups (ctx.facts online) the ConfigMap is read: holding the key is a denial, not holding it
no finding at all. Secrets are never read, so a secretRef without a prefix keeps its warning; so does
a ConfigMap that does not exist yet or could not be read (the warning says why).

A pod whose GPUs come by Dynamic Resource Allocation (a claim with a GPU request, or a
deviceclass.resource.kubernetes.io/<GPU class> resource; policy/dra.py dra_gpus) reaches the NVIDIA
runtime like a GPU pod, and the denial names its claims. Where the runtime is not the default, a pod
with a claim the webhook cannot read gets each denial under `dra.unresolvedClaims` (deny or warn),
saying which claim could not be read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from gpu_stack_webhook.policy.cel_twin import (
    DRA_HELD,
    DRA_NAMES,
    GPU_AMOUNTS,
    GPU_POD,
    NVIDIA_RUNTIME,
    RUNTIME_CONFIG,
    CelValidation,
    Literal,
    Message,
    finding_text,
)
from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.dra import dra_gpus, unresolved_claims, unresolved_note
from gpu_stack_webhook.policy.findings import Finding, Severity
from gpu_stack_webhook.policy.gpus import is_gpu_pod
from gpu_stack_webhook.policy.pod import ContainerRef, PodView
from gpu_stack_webhook.policy.signals import VISIBLE_DEVICES, Signal, reaches_nvidia_runtime

ID = "GPU002"
NAME = "no-nvidia-visible-devices"
# The rule's row of docs/policy-rules.md (markdown; `make generate` writes the table).
DOC = (
    'no `NVIDIA_VISIBLE_DEVICES` in any pod that runs under the NVIDIA runtime: `env` (value or valueFrom), '
    'or `envFrom` with a prefix that could produce it; `envFrom` without a prefix is a warning. Where the '
    "NVIDIA runtime is the nodes' default (policy `nvidiaRuntimeIsDefault`: the chart's `default-runtime` "
    'and `preinstalled` layouts) that is every pod; otherwise GPU pods only (a GPU resource or a GPU runtime '
    'class): any other pod runs under runc, which reads no NVIDIA variable'
)
MUTATING = False  # denies and warns on /validate only (rules/__init__.py)
SCOPE = (Signal.NVIDIA_RUNTIME,)
# What stays webhook-only, and why (rules/__init__.py).
WEBHOOK_ONLY = ("the warnings (an envFrom without a prefix), the ConfigMap lookup, a pod's claims (a lookup) and "
                "claims that cannot be read (dra.unresolvedClaims)")
VARIABLE = VISIBLE_DEVICES
SETS = Message(f"{{label}} sets {VARIABLE} {{spelled}}; {{how}}")
PREFIXED = Message(f'{{label}} imports {{source}} with prefix "{{prefix}}", which can produce {VARIABLE}; use a '
                   f"prefix that is not the start of {VARIABLE}")
SOURCE = Message('{kind} "{name}"')
BY_PLUGIN = "GPUs are assigned by the device plugin, request nvidia.com/gpu instead"
BY_DRA = Message("GPUs come from the pod's {names}, not from this variable: remove it")


def _source(entry: Mapping[str, object]) -> str:
    for key, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
        ref = entry.get(key)
        if isinstance(ref, dict):
            return SOURCE(kind=kind, name=ref.get("name", ""))
    return "a source"


def check(pod: PodView, ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    reaches = reaches_nvidia_runtime(pod, ctx)
    unresolved = {} if reaches else unresolved_claims(pod, ctx)
    if not (reaches or unresolved):
        return findings
    dra = dra_gpus(pod, ctx) if reaches and not is_gpu_pod(pod, ctx) else {}
    how = BY_PLUGIN
    if dra:
        how = BY_DRA(names=", ".join(dict.fromkeys(d for ds in dra.values() for d in ds)))
    for container in pod.containers():
        env = container.env
        if env and _names(env, VARIABLE):
            findings.extend(_named(container, env, how))
        if container.env_from:
            findings.extend(_imported(container, ctx))
    if unresolved:
        severity = Severity.DENY if ctx.config.dra.unresolved_claims == "deny" else Severity.WARN
        note = unresolved_note(c for cs in unresolved.values() for c in cs)
        findings = [Finding(ID, severity, f"{f.message} (if the pod's claims hold a GPU; they could not be read: "
                            f"{note})", f.path) if f.denies else f for f in findings]
    return findings


def _names(env: list[Any], name: str) -> bool:
    """Does an entry of `env` have this name? GPU002 reads every env entry of every container: the hot
    loop, compiled (webhook/setup.py: any() over a generator becomes a plain loop) with the entries read
    as dicts."""
    return any(isinstance(entry, dict) and entry.get("name") == name for entry in env)


def _named(container: ContainerRef, env: list[Any], how: str) -> Iterator[Finding]:
    for index, entry in enumerate(env):
        if isinstance(entry, dict) and entry.get("name") == VARIABLE:
            spelled = "from valueFrom" if "valueFrom" in entry else "explicitly"
            yield Finding(ID, Severity.DENY, SETS(label=container.label, spelled=spelled, how=how),
                          f"{container.path}.env[{index}]")


def _imported(container: ContainerRef, ctx: Context) -> Iterator[Finding]:
    for index, entry in enumerate(container.env_from):
        if not isinstance(entry, dict):
            continue
        prefix = entry.get("prefix") or ""
        path = f"{container.path}.envFrom[{index}]"
        if not isinstance(prefix, str):
            continue
        if prefix and VARIABLE.startswith(prefix):
            yield Finding(ID, Severity.DENY, PREFIXED(label=container.label, source=_source(entry), prefix=prefix),
                          path)
        elif not prefix:
            yield from _unprefixed(container.label, entry, path, ctx)


def _unprefixed(label: str, entry: Mapping[str, object], path: str, ctx: Context) -> Iterator[Finding]:
    warning = f"{label}: envFrom {_source(entry)} has no prefix; it must not hold {VARIABLE}"
    ref = entry.get("configMapRef")
    name = ref.get("name") if isinstance(ref, dict) else None
    if not (ctx.facts.online and ctx.namespace and isinstance(name, str) and name):
        yield Finding(ID, Severity.WARN, warning, path)
        return
    fact = ctx.facts.configmap_keys(ctx.namespace, name)
    # What must not happen first, the reason last: kubectl shows warnings cut to 120 characters.
    if not fact.known:
        yield Finding(ID, Severity.WARN, f'{label}: envFrom ConfigMap "{name}" must not hold {VARIABLE} '
                      f"({fact.note})", path)
    elif fact.value is None:
        yield Finding(ID, Severity.WARN, f'{label}: envFrom ConfigMap "{name}" must not hold {VARIABLE} '
                      "(not found yet)", path)
    elif VARIABLE in fact.value:
        yield Finding(
            ID,
            Severity.DENY,
            f'{label} imports ConfigMap "{name}" (envFrom, no prefix), which holds {VARIABLE}; GPUs are '
            f"assigned by the device plugin: remove that key or set an envFrom prefix",
            path,
        )


# --- The CEL twin ----------------------------------------------------------------------------------------
# The env entries and prefixed envFrom sources of a pod under the NVIDIA runtime; the warnings and the
# ConfigMap lookup stay in the webhook.
_ENV = (
    "variables.containers.map(e, lists.range(size(e.c.?env.orValue([])))"
    f".filter(j, e.c.env[j].name == '{VARIABLE}').map(j, "
    + finding_text(ID, SETS.cel(label="e.label", how="variables.visibleDevicesHint",
                                spelled="(has(e.c.env[j].valueFrom) ? 'from valueFrom' : 'explicitly')"),
                   "e.path + '.env[' + string(j) + ']'")
    + ")).flatten()"
)
_CONFIGMAP = SOURCE.cel(kind=Literal("ConfigMap"), name="f.configMapRef.?name.orValue('')")
_SECRET = SOURCE.cel(kind=Literal("Secret"), name="f.secretRef.?name.orValue('')")
_SOURCE = f"(has(f.configMapRef) ? {_CONFIGMAP} : has(f.secretRef) ? {_SECRET} : 'a source')"
_ENV_FROM = (
    "variables.containers.map(e, lists.range(size(e.c.?envFrom.orValue([]))).map(j, [dyn(j), dyn(e.c.envFrom[j])])"
    f".filter(p, p[1].?prefix.orValue('') != '' && '{VARIABLE}'.startsWith(p[1].prefix)).map(p, cel.bind(f, p[1], "
    + finding_text(ID, PREFIXED.cel(label="e.label", source=_SOURCE, prefix="f.prefix"),
                   "e.path + '.envFrom[' + string(p[0]) + ']'")
    + "))).flatten()"
)
_HINT = f"!{GPU_POD} && size(variables.draHeld) > 0 ? {BY_DRA.cel(names='variables.draNames')} : '{BY_PLUGIN}'"
CEL_VALIDATION = CelValidation(ID, NAME, RUNTIME_CONFIG, (
    GPU_AMOUNTS, DRA_HELD, DRA_NAMES, ("visibleDevicesHint", _HINT),
    ("violations", f"{NVIDIA_RUNTIME} ? {_ENV} + {_ENV_FROM} : []"),
))
