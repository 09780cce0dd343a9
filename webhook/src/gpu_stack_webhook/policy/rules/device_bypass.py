"""GPU007 no-device-requests-outside-plugin: no GPU request that bypasses the device plugin.

Besides NVIDIA_VISIBLE_DEVICES (GPU002) the NVIDIA runtime takes device requests from two other
places a pod controls: volume mounts under /var/run/nvidia-container-devices (the volume-mounts
device list strategy) and CDI annotations `cdi.k8s.io/*` (read by containerd and CRI-O when CDI is
on). Either one hands a container GPUs it was never allocated. CDI annotations are denied on every
pod (the container engine reads them under any runtime); the mounts only where the NVIDIA runtime
runs the pod (GPU002 says when), the only reader of that directory.
"""

from __future__ import annotations

import posixpath

from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.findings import Finding, Severity
from gpu_stack_webhook.policy.pod import PodView
from gpu_stack_webhook.policy.signals import (
    CDI_ANNOTATION_PREFIX,
    DEVICE_LIST_DIR,
    DEVICE_LIST_NAME,
    Signal,
    reaches_nvidia_runtime,
)

ID = "GPU007"
NAME = "no-device-requests-outside-plugin"
MUTATING = False  # denies and warns on /validate only (rules/__init__.py)
SCOPE = (Signal.CDI_ANNOTATION, Signal.NVIDIA_RUNTIME)


def _under_device_dir(mount_path: str) -> bool:
    # The toolkit (DevicesFromMounts) cleans the destination like Go's filepath.Clean, `..` resolved,
    # then matches a plain string prefix: ".../nvidia-container-devicesall" is a request for "all".
    # Cleaning only drops components, so a path without the directory's name cannot match: check() skips
    # the normpath for the mounts every pod has.
    return posixpath.normpath("/" + mount_path.lstrip("/")).startswith(DEVICE_LIST_DIR)


def check(pod: PodView, ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    for key in pod.annotations:
        if key.startswith(CDI_ANNOTATION_PREFIX):
            findings.append(Finding(
                ID,
                Severity.DENY,
                f'annotation "{key}" requests CDI devices directly; request nvidia.com/gpu instead',
                f"{pod.metadata_path}.annotations[{key}]",
            ))
    if not reaches_nvidia_runtime(pod, ctx):
        return findings
    for container in pod.containers():
        for index, mount in enumerate(container.spec.get("volumeMounts") or []):
            if not isinstance(mount, dict):
                continue
            mount_path = mount.get("mountPath")
            if isinstance(mount_path, str) and DEVICE_LIST_NAME in mount_path and _under_device_dir(mount_path):
                findings.append(Finding(
                    ID,
                    Severity.DENY,
                    f"{container.label} mounts {mount_path}, which the NVIDIA runtime reads as a GPU "
                    f"device list; mount it elsewhere",
                    f"{container.path}.volumeMounts[{index}]",
                ))
    return findings
