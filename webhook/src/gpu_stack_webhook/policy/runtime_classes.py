"""Which runtime a pod's RuntimeClass selects. What reaches the NVIDIA runtime is a RuntimeClass's handler,
not its name: an admin's `gpu-fast` with handler `nvidia` is the NVIDIA runtime under another name, and the
GPU Operator (v26.7.0 assets/pre-requisites/0200, 0210, 0220) creates `nvidia`, `nvidia-cdi` and
`nvidia-legacy`. A RuntimeClass is a GPU runtime class when its name is in `gpuRuntimeClassNames` or its
handler in `nvidiaRuntimeHandlers`. A name in `nonGpuRuntimeClassNames` is not, whatever the cluster's read
says: the admin declares it (gVisor, Kata), the chart's ValidatingAdmissionPolicy refuses a RuntimeClass of that
name with an NVIDIA handler, and the API server keeps a RuntimeClass's handler immutable
(kubernetes v1.36 pkg/apis/node/validation/validation.go, ValidateRuntimeClassUpdate), so the webhook
configurations' matchConditions leave such pods out. A declared name found with an NVIDIA handler (created
before the policy) is logged by kube/live.py.

The handlers come from the cluster (config `runtimeClasses`, read by kube/live.py every few seconds). A name
the last read did not hold (a RuntimeClass created since) is asked of the API (`ctx.facts`) when lookups are
on. What cannot be known (the read failed, a name neither read nor looked up, a RuntimeClass without a
handler) is `UNKNOWN`: the pod counts
as a GPU pod and GPU010 denies it, naming why (fail closed). Offline (config `runtimeClasses` unset: `check`,
CEL mode) only the names count.
"""

from __future__ import annotations

import enum

from gpu_stack_webhook.policy.context import Context


class Runtime(enum.Enum):
    NVIDIA = "nvidia"
    OTHER = "other"
    UNKNOWN = "unknown"


def runtime_of(name: object, ctx: Context) -> tuple[Runtime, str]:
    """The runtime RuntimeClass `name` selects, with why it is unknown (or its handler when known)."""
    if not isinstance(name, str) or not name:
        return Runtime.OTHER, ""
    config = ctx.config
    if name in config.gpu_runtime_class_names:
        return Runtime.NVIDIA, name
    if name in config.non_gpu_runtime_class_names:
        return Runtime.OTHER, ""
    known = config.runtime_classes
    if known is None:
        return Runtime.OTHER, ""
    if known.error:
        return Runtime.UNKNOWN, f"RuntimeClasses cannot be read: {known.error}"
    handler = known.handlers.get(name)
    if handler is None:
        if not ctx.facts.online:
            return Runtime.UNKNOWN, (f"RuntimeClass {name} is not among those the webhook has read, and lookups "
                                     f"are off (webhook.lookups.enabled); retry in a few seconds")
        fact = ctx.facts.runtime_class_handler(name)
        if not fact.known:
            return Runtime.UNKNOWN, f"RuntimeClass {name} cannot be read: {fact.note}"
        if fact.value is None:  # no such RuntimeClass: the API server refuses its pods (RuntimeClass admission)
            return Runtime.OTHER, ""
        handler = fact.value
    if not handler:  # the API server requires a handler: what runs this pod is not known
        return Runtime.UNKNOWN, f"RuntimeClass {name} has no handler"
    return (Runtime.NVIDIA if handler in config.nvidia_runtime_handlers else Runtime.OTHER), handler


def is_gpu_runtime_class(name: object, ctx: Context) -> bool:
    """Does RuntimeClass `name` make a pod a GPU pod: the NVIDIA runtime, or not known (fail closed)?"""
    return runtime_of(name, ctx)[0] is not Runtime.OTHER
