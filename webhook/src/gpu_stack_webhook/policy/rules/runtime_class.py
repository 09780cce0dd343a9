"""GPU008 gpu-runtime-class: GPU pods run under the NVIDIA runtime class when it is not the node default.

In the chart's default runtime layout the NVIDIA runtime is not containerd's (or CRI-O's) default
runtime, so the privileged agents of a GPU node (CNI, monitoring, anything from a CUDA base image)
are not handed every GPU by the runtime. GPU pods then need `runtimeClassName: nvidia`. With
`injectRuntimeClassName` set, the mutating pass adds it to a Pod being created that allocates a GPU
(some container names a GPU resource with a count above 0) and names no runtime class; a warning says
so. A pod that names another runtime class keeps it (its GPUs then reach it only through CDI, or not
at all). Pods that name the class without a GPU are judged as GPU pods by GPU003.
"""

from __future__ import annotations

from gpu_stack_webhook.policy.cel_twin import ALLOCATED, GPU_AMOUNTS, CelMutation, patch_op
from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.findings import Finding, Severity
from gpu_stack_webhook.policy.gpus import allocates_gpus
from gpu_stack_webhook.policy.pod import PodView
from gpu_stack_webhook.policy.signals import Signal

ID = "GPU008"
NAME = "gpu-runtime-class"
# The rule's row of docs/policy-rules.md (markdown; `make generate` writes the table).
DOC = (
    'with `injectRuntimeClassName` set (the chart sets it in its default runtime layout, where `nvidia` is '
    "not the nodes' default runtime), a Pod being created that allocates a GPU and names no runtime class "
    'gets `runtimeClassName: nvidia` (warning)'
)
SCOPE = (Signal.GPU_RESOURCES,)  # policy/signals.py
# What stays webhook-only, and why (rules/__init__.py).
WEBHOOK_ONLY = "the warning saying what was set"


def check(pod: PodView, ctx: Context) -> list[Finding]:
    wanted = ctx.config.inject_runtime_class_name
    if not wanted or not ctx.can_patch or pod.spec.get("runtimeClassName") or not allocates_gpus(pod, ctx):
        return []
    pod.desired.edit(pod.pointer)["runtimeClassName"] = wanted
    return [Finding(
        ID,
        Severity.WARN,
        f"set runtimeClassName {wanted}: GPU pods run under the NVIDIA runtime",
        f"{pod.path}.runtimeClassName",
        changed=True,
    )]


# --- The CEL twin ----------------------------------------------------------------------------------------
CEL_MUTATION = CelMutation(
    ID, NAME, ("gpuNames", "gpuPrefixes", "injectRuntimeClassName"),
    (GPU_AMOUNTS, ALLOCATED),
    "variables.injectRuntimeClassName != '' && variables.podSpec.?runtimeClassName.orValue('') == '' && "
    "size(variables.allocatedPaths) > 0 ? "
    f"[{patch_op(repr('/spec/runtimeClassName'), 'variables.injectRuntimeClassName')}] : []",
)
