"""GPU011 gpu-runtime-needs-own-gpu: under a GPU runtime class every container has its own GPU (image env picks GPUs).

Why (nvidia-container-toolkit v1.20.0: cmd/nvidia-ctk-installer/main_test.go "no args" writes
accept-nvidia-visible-devices-envvar-when-unprivileged = true, cmd/nvidia-ctk-installer/toolkit/toolkit.go
reads ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED; GPU Operator v26.7.0 does not set it): with
that setting the NVIDIA runtime hands a container whatever GPUs its image environment names, and every
CUDA image bakes in NVIDIA_VISIBLE_DEVICES=all, invisible in the pod spec. A container the device plugin
allocated a GPU to gets the plugin's device list, which takes precedence (sharing.py
list_overrides_image_env); any other container run by the NVIDIA runtime gets every GPU of the node.
On a GPU Operator cluster (CDI on, the default) pods reach the NVIDIA runtime only by naming its runtime class
(`nvidia`, `nvidia-cdi`, `nvidia-legacy`, created by the operator for any pod to use), so a pod that names a
GPU runtime class (by name or handler: policy/runtime_classes.py) is denied for each container (init and
ephemeral ones included) without a GPU of its own: a GPU resource with a count above 0, or a DRA claim with a
GPU request. Only when the policy says the toolkit accepts the variable (`envvarWhenUnprivileged`: read from
the GPU Operator's ClusterPolicy, true with the toolkit's default; false for this chart's toolkit).
Where the NVIDIA runtime is every
pod's default runtime no admission rule can close this: the node's toolkit configuration must
(docs/gpu-operator.md).
"""

from __future__ import annotations

from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.dra import dra_gpus
from gpu_stack_webhook.policy.findings import Finding, Severity
from gpu_stack_webhook.policy.gpus import allocated_gpus
from gpu_stack_webhook.policy.pod import PodView
from gpu_stack_webhook.policy.runtime_classes import Runtime, runtime_of
from gpu_stack_webhook.policy.signals import Signal

ID = "GPU011"
NAME = "gpu-runtime-needs-own-gpu"
# The rule's row of docs/policy-rules.md (markdown; `make generate` writes the table).
DOC = (
    'under a GPU runtime class, every container needs a GPU of its own where the toolkit honours '
    "`NVIDIA_VISIBLE_DEVICES` from unprivileged containers (read from the ClusterPolicy's `toolkit.env`; "
    'assumed beside the device-plugin chart, which leaves the toolkit at its default; never with this '
    "chart's own layout). See [gpu-operator.md](gpu-operator.md)"
)
SCOPE = (Signal.GPU_POD,)  # policy/signals.py
# What stays webhook-only, and why (rules/__init__.py).
WEBHOOK_ONLY = ("whether the toolkit accepts the image environment (envvarWhenUnprivileged) comes from the live "
                "policy source, and a pod's claims need a lookup")
MUTATING = False  # denies on /validate only (rules/__init__.py)


def check(pod: PodView, ctx: Context) -> list[Finding]:
    runtime_class = pod.spec.get("runtimeClassName")
    if not ctx.config.envvar_when_unprivileged or runtime_of(runtime_class, ctx)[0] is not Runtime.NVIDIA:
        return []
    own = allocated_gpus(pod, ctx).keys() | dra_gpus(pod, ctx).keys()
    return [Finding(
        ID,
        Severity.DENY,
        f'container "{container.name}" runs under runtime class {runtime_class} without a GPU of its own, and '
        "the NVIDIA runtime there gives it every GPU its image names (NVIDIA_VISIBLE_DEVICES=all in CUDA "
        "images); request nvidia.com/gpu for it, or run the pod without that runtime class",
        container.path,
    ) for container in pod.containers() if container.pointer not in own]
