"""GPU003 no-privileged-gpu-containers: no privileged container (of any kind) in a GPU pod.

A privileged container sees every device node on the host, so in a GPU pod it reaches GPUs that were
never allocated to it. A GPU pod requests any GPU resource in any container, or runs with one of the
configured GPU runtime classes.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..findings import Finding, Severity
from ..pod import PodView
from .base import Context, is_gpu_pod

ID = "GPU003"
NAME = "no-privileged-gpu-containers"


def check(pod: PodView, ctx: Context) -> Iterator[Finding]:
    privileged = [c for c in pod.containers() if c.security_context.get("privileged") is True]
    if not privileged or not is_gpu_pod(pod, ctx):
        return
    for container in privileged:
        yield Finding(
            ID,
            Severity.DENY,
            f"{container.label} is privileged in a GPU pod and would see every GPU on the node; "
            f"remove securityContext.privileged",
            f"{container.path}.securityContext.privileged",
        )
