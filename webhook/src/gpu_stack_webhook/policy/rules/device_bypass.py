"""GPU007 no-device-requests-outside-plugin: no GPU request that bypasses the device plugin.

Besides NVIDIA_VISIBLE_DEVICES (GPU002) the NVIDIA runtime takes device requests from two other
places a pod controls: volume mounts under /var/run/nvidia-container-devices (the volume-mounts
device list strategy) and CDI annotations: `cdi.k8s.io/*` (read by containerd and CRI-O when CDI is
on) and `nvidia.cdi.k8s.io/container.<name>`, `/pod` or the bare domain (read by the toolkit's NRI plugin,
policy/signals.py NRI_ANNOTATION_DOMAIN). Either one hands a container GPUs it was never allocated. Both
are denied on every pod, whatever the policy says of NRI: the container engine reads the CDI ones under
any runtime, and the NRI plugin can be switched on (ClusterPolicy `cdi.nriPluginEnabled`, or toolkit.env
`ENABLE_NRI_PLUGIN`) while an admitted annotation waits in a running pod, so the webhook and its CEL twin
give one answer; the mounts only where the NVIDIA runtime runs the pod (GPU002 says when), the only reader
of that directory.
The GPU Operator's own pods, which carry `nvidia.cdi.k8s.io/container.<name>: management.nvidia.com/gpu=all`
in NRI mode, are admitted before any rule runs (policy/operator_owned.py).
"""

from __future__ import annotations

import posixpath

from gpu_stack_webhook.policy.cel_twin import (
    DRA_HELD,
    GPU_AMOUNTS,
    NVIDIA_RUNTIME,
    RUNTIME_CONFIG,
    CelValidation,
    Message,
    finding_text,
)
from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.findings import Finding, Severity
from gpu_stack_webhook.policy.pod import PodView
from gpu_stack_webhook.policy.signals import (
    DEVICE_ANNOTATION_CEL,
    DEVICE_LIST_DIR,
    DEVICE_LIST_NAME,
    Signal,
    is_device_annotation,
    reaches_nvidia_runtime,
)

ID = "GPU007"
NAME = "no-device-requests-outside-plugin"
# The rule's row of docs/policy-rules.md (markdown; `make generate` writes the table).
DOC = (
    'no `cdi.k8s.io/*` pod annotations (every pod: the container engine reads them under any runtime), no '
    '`nvidia.cdi.k8s.io/` annotations (`/container.<name>`, `/pod`, the bare key: the toolkit\'s NRI plugin '
    'reads them once it is switched on, whatever the ClusterPolicy says now) on any pod but the GPU '
    'Operator\'s, and no '
    'volume mounts under `/var/run/nvidia-container-devices` (pods under the NVIDIA runtime, as GPU002): '
    'both hand a container GPUs the device plugin never allocated'
)
MUTATING = False  # denies and warns on /validate only (rules/__init__.py)
SCOPE = (Signal.CDI_ANNOTATION, Signal.NVIDIA_RUNTIME)
CDI_REQUEST = Message('annotation "{key}" requests CDI devices directly; request nvidia.com/gpu instead')
DEVICE_LIST_MOUNT = Message("{label} mounts {path}, which the NVIDIA runtime reads as a GPU device list; mount it "
                            "elsewhere")


def _under_device_dir(mount_path: str) -> bool:
    # The toolkit (DevicesFromMounts) cleans the destination like Go's filepath.Clean, `..` resolved,
    # then matches a plain string prefix: ".../nvidia-container-devicesall" is a request for "all".
    # Cleaning only drops components, so a path without the directory's name cannot match: check() skips
    # the normpath for the mounts every pod has.
    return posixpath.normpath("/" + mount_path.lstrip("/")).startswith(DEVICE_LIST_DIR)


def check(pod: PodView, ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    for key in pod.annotations:
        if is_device_annotation(key):
            findings.append(Finding(ID, Severity.DENY, CDI_REQUEST(key=key), f"{pod.metadata_path}.annotations[{key}]"))
    if not reaches_nvidia_runtime(pod, ctx):
        return findings
    for container in pod.containers():
        for index, mount in enumerate(container.spec.get("volumeMounts") or []):
            if not isinstance(mount, dict):
                continue
            mount_path = mount.get("mountPath")
            if isinstance(mount_path, str) and DEVICE_LIST_NAME in mount_path and _under_device_dir(mount_path):
                findings.append(Finding(ID, Severity.DENY, DEVICE_LIST_MOUNT(label=container.label, path=mount_path),
                                        f"{container.path}.volumeMounts[{index}]"))
    return findings


# --- The CEL twin ----------------------------------------------------------------------------------------
_CDI = (
    f"variables.annotations.filter(k, {DEVICE_ANNOTATION_CEL}).map(k, "
    + finding_text(ID, CDI_REQUEST.cel(key="k"), "variables.metaPath + '.annotations[' + k + ']'")
    + ")"
)
# posixpath.normpath, lexically like the toolkit's filepath.Clean: the path's segments without '' and
# '.', each '..' pops one (never above the root). Stack depth after segment i is the running sum of
# +1/-1 minus its lowest point below zero; the cleaned path's k-th component is the last name pushed
# to depth k+1. The path is under the device list dir when its first three components are var, run
# and a name starting with nvidia-container-devices (a plain string prefix, as the toolkit matches).
_DEPTHS = ("cel.bind(d, lists.range(size(s)).map(i, lists.range(i + 1).map(j, s[j] == '..' ? -1 : 1).sum()), "
           "lists.range(size(s)).map(i, cel.bind(low, lists.range(i + 1).map(j, d[j]).min(), "
           "d[i] - (low < 0 ? low : 0))))")


def _component(k: int) -> str:
    return f"lists.range(size(s)).filter(i, s[i] != '..' && depth[i] == {k + 1})"


_DIR_PARTS = DEVICE_LIST_DIR.strip("/").split("/")  # var, run, nvidia-container-devices
_UNDER_DEVICE_DIR = (
    "cel.bind(s, m.mountPath.split('/').filter(x, x != '' && x != '.'), "
    f"cel.bind(depth, {_DEPTHS}, size(s) > 0 && depth[size(s) - 1] >= 3 && "
    + " && ".join(
        f"cel.bind(at, {_component(k)}, s[at[size(at) - 1]]"
        + (f" == '{part}')" if k < 2 else f".startsWith('{part}'))")
        for k, part in enumerate(_DIR_PARTS))
    + "))"
)
_MOUNTS = (
    "variables.containers.map(e, lists.range(size(e.c.?volumeMounts.orValue([])))"
    ".map(j, [dyn(j), dyn(e.c.volumeMounts[j])])"
    f".filter(p, cel.bind(m, p[1], has(m.mountPath) && {_UNDER_DEVICE_DIR})).map(p, "
    + finding_text(ID, DEVICE_LIST_MOUNT.cel(label="e.label", path="p[1].mountPath"),
                   "e.path + '.volumeMounts[' + string(p[0]) + ']'")
    + ")).flatten()"
)
CEL_VALIDATION = CelValidation(ID, NAME, RUNTIME_CONFIG, (
    GPU_AMOUNTS, DRA_HELD, ("violations", f"{_CDI} + ({NVIDIA_RUNTIME} ? {_MOUNTS} : [])"),
))
