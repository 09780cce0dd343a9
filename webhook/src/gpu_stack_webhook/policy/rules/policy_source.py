"""GPU010 policy-source-readable: no GPU pod while the live configuration the policy follows cannot be read.

With `serve --policy-source gpu-operator` or `device-plugin` (docs/gpu-operator.md) the sharing configs,
MIG strategy and runtime layout come from the GPU Operator's ClusterPolicy and the device plugin's
ConfigMap. When they cannot be read (no permission, object missing, a config the device plugin would
reject, a ClusterPolicy of a schema version gpu-stack does not read), the webhook does not guess: every
GPU pod (a GPU resource, a GPU runtime class, or DRA claims) is denied with a message naming what is
missing (policy `sourceError`), until the source can be read again. Other pods are judged as before.
So is a pod whose runtime class may select the NVIDIA runtime while that cannot be known: the RuntimeClasses
cannot be read, or one is named that the webhook has not read and cannot look up (policy/runtime_classes.py).
"""

from __future__ import annotations

from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.dra import names_dra
from gpu_stack_webhook.policy.findings import Finding, Severity
from gpu_stack_webhook.policy.gpus import is_gpu_pod
from gpu_stack_webhook.policy.pod import PodView
from gpu_stack_webhook.policy.runtime_classes import Runtime, runtime_of
from gpu_stack_webhook.policy.signals import Signal

ID = "GPU010"
NAME = "policy-source-readable"
# The rule's row of docs/policy-rules.md (markdown; `make generate` writes the table).
DOC = (
    'with `webhook.policySource.mode` `gpu-operator` or `device-plugin` (the policy-only overlays), GPU pods '
    'are denied while the live GPU configuration (the ClusterPolicy, the device plugin ConfigMap) cannot be '
    'read or is not understood; the message names what is missing. See [gpu-operator.md](gpu-operator.md)'
)
SCOPE = (Signal.GPU_POD,)  # policy/signals.py
# What stays webhook-only, and why (rules/__init__.py).
WEBHOOK_ONLY = ("the live policy source (the GPU Operator's ClusterPolicy, the device plugin's ConfigMap) is read by "
                "the webhook")
MUTATING = False  # denies on /validate only (rules/__init__.py)


def check(pod: PodView, ctx: Context) -> list[Finding]:
    findings = []
    runtime_class = pod.spec.get("runtimeClassName")
    if runtime_class:
        runtime, why = runtime_of(runtime_class, ctx)
        if runtime is Runtime.UNKNOWN:
            findings.append(Finding(ID, Severity.DENY, f"runtime class {runtime_class} may be the NVIDIA runtime, "
                                    f"which cannot be known: {why}", f"{pod.path}.runtimeClassName"))
    missing = ctx.config.source_error
    if missing and (is_gpu_pod(pod, ctx) or names_dra(pod)):
        findings.append(Finding(ID, Severity.DENY, f"the GPU configuration this policy follows cannot be read: "
                                f"{missing}", f"{pod.path}"))
    return findings
