"""The signals: what in a request lets a rule act on it."""

from __future__ import annotations

import enum

from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.dra import dra_gpus
from gpu_stack_webhook.policy.gpus import is_gpu_pod
from gpu_stack_webhook.policy.pod import PodView


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


def reaches_nvidia_runtime(pod: PodView, ctx: Context) -> bool:
    """Does the pod run under the NVIDIA runtime (Signal.NVIDIA_RUNTIME)? Only there do
    NVIDIA_VISIBLE_DEVICES and the device list mounts select GPUs. A pod whose GPUs come by DRA counts."""
    return ctx.config.nvidia_runtime_is_default or is_gpu_pod(pod, ctx) or bool(dra_gpus(pod, ctx))
