"""Hypothesis strategies: arbitrary JSON, schema-valid pod-shaped objects, workload wrappers, reviews.

Pods are built to be valid against the strict Kubernetes JSON schema (kubernetes-validate, see
`schema.py`) so that "the patched pod is still a valid Pod" means something: whatever breaks it was
our patch. Field values are drawn from small pools that include the tricky spellings and names the
rules care about (quantities "1" / 1 / "1000m" / "1e0", NVIDIA_VISIBLE_DEVICES via value, valueFrom
and envFrom prefixes, device-list mount paths with `..` and `//`, CDI annotations, MPS selectors).

A rule with a CEL twin is held to the pools: tests/property/test_rule_coverage.py fails while a field its
module reads is never generated, or while it never denies (changes) some object and allows another.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

from hypothesis import strategies as st

API = {
    "Pod": "v1",
    "Deployment": "apps/v1",
    "ReplicaSet": "apps/v1",
    "StatefulSet": "apps/v1",
    "DaemonSet": "apps/v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1",
}
WORKLOAD_KINDS = tuple(k for k in API if k != "Pod")
CONFIG_LABEL = "nvidia.com/device-plugin.config"

# --- arbitrary JSON ---------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
arbitrary_json = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=25,
)

# --- pools --------------------------------------------------------------------------------------------

RESOURCE_NAMES = (
    "nvidia.com/gpu", "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.5gb", "nvidia.com/mig-3g.20gb",
    "nvidia.com/mig-7g.80gb", "nvidia.com/vgpu", "cpu", "memory", "example.com/fpga",
    # KEP-5004 DRA extended resources: GPU DeviceClasses (policy dra.gpuDeviceClasses) and another one.
    "deviceclass.resource.kubernetes.io/gpu.nvidia.com", "deviceclass.resource.kubernetes.io/mig.nvidia.com",
    "deviceclass.resource.kubernetes.io/nic.example.com",
)
QUANTITIES = (
    1, "1", "1000m", "2", 2, 0, "0", "500m", "1.5", 1.5, "1e0", "1k", "2Ki", "10", 4, "0.0", "+1", "01", "3000m",
)
ENV_NAMES = (
    "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "FOO", "nvidia_visible_devices",
)
ENV_FROM_PREFIXES = (
    None, "", "N", "NV", "NVIDIA_", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICESX", "APP_", "nvidia_",
)
MOUNT_PATHS = (
    "/data", "/var/run/nvidia-container-devices", "/var/run/nvidia-container-devices/all",
    "/var/run/nvidia-container-devicesall", "//var/run//nvidia-container-devices/0",
    "/var/run/x/../nvidia-container-devices/GPU-1", "var/run/nvidia-container-devices", "/var/run/nvidia",
    "/run/nvidia-container-devices/all",
)
ANNOTATION_KEYS = (
    "gpu-stack.io/mps", "cdi.k8s.io/gpu", "cdi.k8s.io/", "example.com/note", "nvidia.com/gpu",
)
ANNOTATION_VALUES = ("true", "false", "TRUE", "True", "nvidia.com/gpu=all", "")
SELECTOR_LABELS = {
    CONFIG_LABEL: ("default", "mps-x10", "ts-x4", "ts-x4-lenient", "mig-mixed", "mig-single", "unknown"),
    "nvidia.com/mps.capable": ("true", "false"),
    "kubernetes.io/os": ("linux",),
}
TOLERATION_KEYS = (None, "gpu-stack.io/mps", "nvidia.com/gpu", "other")
RUNTIME_CLASSES = (None, "nvidia", "runc", "nvidia-cdi", "gvisor")

dns_label = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8).map(lambda s: "c" + s)


def _optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


@st.composite
def resources(draw: st.DrawFn) -> dict[str, Any] | None:
    def section() -> dict[str, Any]:
        keys = draw(st.lists(st.sampled_from(RESOURCE_NAMES), max_size=3, unique=True))
        return {k: draw(st.sampled_from(QUANTITIES)) for k in keys}

    out: dict[str, Any] = {}
    shape = draw(st.sampled_from(("none", "requests", "limits", "both", "equal", "empty")))
    if shape == "none":
        return None
    if shape in ("requests", "both"):
        out["requests"] = section()
    if shape in ("limits", "both"):
        out["limits"] = section()
    if shape == "equal":
        same = section()
        out["requests"], out["limits"] = same, copy.deepcopy(same)
    return out


value_from = st.sampled_from((
    {"configMapKeyRef": {"name": "cm", "key": "k"}},
    {"secretKeyRef": {"name": "s", "key": "k", "optional": True}},
    {"fieldRef": {"fieldPath": "metadata.annotations['gpus']"}},
))


@st.composite
def env_var(draw: st.DrawFn) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": draw(st.sampled_from(ENV_NAMES))}
    how = draw(st.sampled_from(("value", "valueFrom", "bare")))
    if how == "value":
        entry["value"] = draw(st.sampled_from(("all", "0", "none", "GPU-abc", "")))
    elif how == "valueFrom":
        entry["valueFrom"] = draw(value_from)
    return entry


@st.composite
def env_from(draw: st.DrawFn) -> dict[str, Any]:
    ref = draw(st.sampled_from(("configMapRef", "secretRef")))
    entry: dict[str, Any] = {ref: {"name": draw(dns_label)}}
    prefix = draw(st.sampled_from(ENV_FROM_PREFIXES))
    if prefix is not None:
        entry["prefix"] = prefix
    return entry


@st.composite
def security_context(draw: st.DrawFn) -> dict[str, Any] | None:
    if draw(st.booleans()):
        return None
    sc: dict[str, Any] = {}
    for key in ("privileged", "allowPrivilegeEscalation", "runAsNonRoot", "readOnlyRootFilesystem"):
        value = draw(_optional(st.booleans()))
        if value is not None:
            sc[key] = value
    if draw(st.booleans()):
        sc["capabilities"] = {"drop": ["ALL"], **({"add": ["SYS_ADMIN"]} if draw(st.booleans()) else {})}
    return sc


@st.composite
def a_container(draw: st.DrawFn, name: str, field: str) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"}
    res = draw(resources())
    if res is not None and field != "ephemeralContainers":
        c["resources"] = res
    elif res is not None and draw(st.booleans()):
        c["resources"] = res  # the schema allows it; the apiserver would refuse it on an ephemeral container
    if draw(st.booleans()):
        c["env"] = draw(st.lists(env_var(), max_size=3))
    if draw(st.integers(0, 3)) == 0:
        c["envFrom"] = draw(st.lists(env_from(), max_size=2))
    sc = draw(security_context())
    if sc is not None:
        c["securityContext"] = sc
    if draw(st.integers(0, 3)) == 0:
        paths = draw(st.lists(st.sampled_from(MOUNT_PATHS), min_size=1, max_size=2, unique=True))
        c["volumeMounts"] = [{"name": "scratch", "mountPath": p} for p in paths]
    if field == "ephemeralContainers" and draw(st.booleans()):
        c["targetContainerName"] = "main"
    if field == "initContainers" and draw(st.integers(0, 3)) == 0:
        c["restartPolicy"] = "Always"  # a sidecar
    return c


@st.composite
def node_affinity(draw: st.DrawFn) -> dict[str, Any]:
    terms = []
    for _ in range(draw(st.integers(1, 2))):
        key = draw(st.sampled_from(sorted(SELECTOR_LABELS)))
        op = draw(st.sampled_from(("In", "NotIn", "Exists")))
        expr: dict[str, Any] = {"key": key, "operator": op}
        if op != "Exists":
            expr["values"] = draw(st.lists(st.sampled_from(SELECTOR_LABELS[key]), min_size=1, max_size=2, unique=True))
        terms.append({"matchExpressions": [expr]})
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


@st.composite
def toleration(draw: st.DrawFn) -> dict[str, Any]:
    t: dict[str, Any] = {}
    key = draw(st.sampled_from(TOLERATION_KEYS))
    if key is not None:
        t["key"] = key
    op = draw(st.sampled_from((None, "Exists", "Equal")))
    if op is not None:
        t["operator"] = op
    if op != "Exists" and draw(st.booleans()):
        t["value"] = draw(st.sampled_from(("true", "")))
    effect = draw(st.sampled_from((None, "NoSchedule", "NoExecute", "PreferNoSchedule")))
    if effect is not None:
        t["effect"] = effect
    return t


@st.composite
def pod_spec(draw: st.DrawFn) -> dict[str, Any]:
    names = iter(draw(st.lists(dns_label, min_size=9, max_size=9, unique=True)))
    spec: dict[str, Any] = {"containers": [draw(a_container("main", "containers"))]}
    spec["containers"] += [draw(a_container(next(names), "containers")) for _ in range(draw(st.integers(0, 2)))]
    for field in ("initContainers", "ephemeralContainers"):
        n = draw(st.integers(0, 2))
        if n:
            spec[field] = [draw(a_container(next(names), field)) for _ in range(n)]
    if draw(st.booleans()):
        keys = draw(st.lists(st.sampled_from(sorted(SELECTOR_LABELS)), max_size=2, unique=True))
        spec["nodeSelector"] = {k: draw(st.sampled_from(SELECTOR_LABELS[k])) for k in keys}
    if draw(st.integers(0, 3)) == 0:
        spec["affinity"] = draw(node_affinity())
    if draw(st.integers(0, 2)) == 0:
        spec["tolerations"] = draw(st.lists(toleration(), max_size=3))
    runtime = draw(st.sampled_from(RUNTIME_CLASSES))
    if runtime is not None:
        spec["runtimeClassName"] = runtime
    host_ipc = draw(_optional(st.booleans()))
    if host_ipc is not None:
        spec["hostIPC"] = host_ipc
    fields = ("containers", "initContainers", "ephemeralContainers")
    if any("volumeMounts" in c for f in fields for c in spec.get(f, [])):
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    return spec


@st.composite
def annotations(draw: st.DrawFn) -> dict[str, str] | None:
    if draw(st.booleans()):
        return None
    keys = draw(st.lists(st.sampled_from(ANNOTATION_KEYS), max_size=3, unique=True))
    return {k: draw(st.sampled_from(ANNOTATION_VALUES)) for k in keys}


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    """A Pod, valid against the strict Kubernetes schema."""
    meta: dict[str, Any] = {"name": draw(dns_label), "namespace": draw(st.sampled_from(("gpu-demo", "team-a")))}
    ann = draw(annotations())
    if ann:
        meta["annotations"] = ann
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": draw(pod_spec())}


def wrap(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    """A workload of `kind` whose pod template is `pod` (the Pod itself for kind Pod)."""
    if kind == "Pod":
        return copy.deepcopy(pod)
    meta = pod["metadata"]
    template_meta: dict[str, Any] = {"labels": {"app": meta["name"]}}
    if "annotations" in meta:
        template_meta["annotations"] = dict(meta["annotations"])
    template = {"metadata": template_meta, "spec": copy.deepcopy(pod["spec"])}
    spec: dict[str, Any]
    if kind in ("Job", "CronJob"):
        template["spec"]["restartPolicy"] = "Never"
    if kind == "Job":
        spec = {"template": template}
    elif kind == "CronJob":
        spec = {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": template}}}
    else:
        spec = {"selector": {"matchLabels": {"app": meta["name"]}}, "template": template}
        if kind == "StatefulSet":
            spec["serviceName"] = meta["name"]
    return {"apiVersion": API[kind], "kind": kind,
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]}, "spec": spec}


objects = st.builds(wrap, pods(), st.sampled_from(tuple(API)))


def review_body(obj: dict[str, Any] | None, *, operation: str = "CREATE", old: dict[str, Any] | None = None,
                sub_resource: str = "", dry_run: bool = False, namespace: str | None = None) -> dict[str, Any]:
    source = obj if obj is not None else old or {}
    kind = str(source.get("kind", "Pod"))
    group, _, version = API.get(kind, str(source.get("apiVersion") or "v1")).rpartition("/")
    meta = source.get("metadata") or {}
    request: dict[str, Any] = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
        "name": meta.get("name", ""),
        "namespace": namespace or meta.get("namespace", "gpu-demo"),
        "operation": operation,
        "userInfo": {"username": "fuzz"},
        "object": obj,
        "oldObject": old,
        "dryRun": dry_run,
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


@st.composite
def reviews(draw: st.DrawFn) -> dict[str, Any]:
    """CREATE of any judged kind, or UPDATE with an oldObject (a different pod of the same kind, or
    the same one with an ephemeral container added through pods/ephemeralcontainers)."""
    kind = draw(st.sampled_from(tuple(API)))
    new = wrap(draw(pods()), kind)
    operation = draw(st.sampled_from(("CREATE", "CREATE", "UPDATE", "DELETE")))
    dry_run = draw(st.booleans())
    if operation == "CREATE":
        return review_body(new, dry_run=dry_run)
    if operation == "DELETE":
        return review_body(None, operation="DELETE", old=new, dry_run=dry_run)
    if kind == "Pod" and draw(st.booleans()):
        old = copy.deepcopy(new)
        old["spec"].pop("ephemeralContainers", None)
        return review_body(new, operation="UPDATE", old=old, sub_resource="ephemeralcontainers", dry_run=dry_run)
    old = wrap(draw(pods()), kind)
    old["metadata"] = dict(new["metadata"])
    return review_body(new, operation="UPDATE", old=old, dry_run=dry_run)


@st.composite
def corrupted(draw: st.DrawFn, base: st.SearchStrategy[Any]) -> Any:
    """`base` with a few nodes replaced by arbitrary JSON (type confusion anywhere in the tree)."""
    value = copy.deepcopy(draw(base))
    for _ in range(draw(st.integers(1, 4))):
        node, parent, key = value, None, None
        for _ in range(draw(st.integers(0, 8))):
            if isinstance(node, dict) and node:
                parent, key = node, draw(st.sampled_from(sorted(node)))
            elif isinstance(node, list) and node:
                parent, key = node, draw(st.integers(0, len(node) - 1))
            else:
                break
            node = parent[key]
        replacement = draw(arbitrary_json)
        if parent is None:
            return replacement
        parent[key] = replacement
    return value


# --- Dynamic Resource Allocation: ResourceClaims and ResourceClaimTemplates (GPU009) -------------------------

DEVICE_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com", "nic.example.com", None)
CLAIM_NAMESPACES = ("gpu-demo", "gpu-admin", "team-a")
MEMORY_LIMITS = ("10Gi", "512Mi", 1024, "lots", True, None, 1.5, "")


@st.composite
def device_request_spec(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    device_class = draw(st.sampled_from(DEVICE_CLASSES))
    if device_class is not None:
        spec["deviceClassName"] = device_class
    if draw(st.booleans()):
        spec["allocationMode"] = draw(st.sampled_from(("All", "ExactCount")))
    if draw(st.booleans()):
        spec["adminAccess"] = draw(st.sampled_from((True, False)))
    return spec


@st.composite
def opaque_parameters(draw: st.DrawFn) -> Any:
    shape = draw(st.integers(0, 9))
    if shape == 0:
        return draw(st.sampled_from(("MPS", 1, None, [])))
    params: dict[str, Any] = {
        "apiVersion": draw(st.sampled_from(("resource.nvidia.com/v1beta1",) * 4 + ("resource.nvidia.com/v1", None))),
        "kind": draw(st.sampled_from(("GpuConfig", "GpuConfig", "MigDeviceConfig", "VfioDeviceConfig"))),
    }
    if shape == 1:
        params["sharing"] = draw(st.sampled_from(("MPS", None, 3)))
    elif shape > 2:
        sharing: dict[str, Any] = {"strategy": draw(st.sampled_from(("MPS", "MPS", "TimeSlicing", "Mps", 1)))}
        if draw(st.booleans()):
            mps = draw(st.sampled_from(({}, {"defaultActiveThreadPercentage": 50}, "x", None)))
            if isinstance(mps, dict) and draw(st.booleans()):
                mps = {**mps, "defaultPinnedDeviceMemoryLimit": draw(st.sampled_from(MEMORY_LIMITS))}
            sharing["mpsConfig"] = mps
        params["sharing"] = sharing
    return params


@st.composite
def claims(draw: st.DrawFn) -> dict[str, Any]:
    """A ResourceClaim or ResourceClaimTemplate with GPU and other requests and NVIDIA opaque configs."""
    requests = []
    for i in range(draw(st.integers(0, 3))):
        request: dict[str, Any] = {"name": f"r{i}"}
        if draw(st.integers(0, 2)) == 0:
            request["firstAvailable"] = [{"name": f"a{j}", **draw(device_request_spec())}
                                         for j in range(draw(st.integers(1, 3)))]
        else:
            request["exactly"] = draw(device_request_spec())
        requests.append(request)
    config = []
    for _ in range(draw(st.integers(0, 3))):
        driver = draw(st.sampled_from(("gpu.nvidia.com", "gpu.nvidia.com", "nic.example.com")))
        entry: dict[str, Any] = {"opaque": {"driver": driver, "parameters": draw(opaque_parameters())}}
        if draw(st.booleans()):
            entry["requests"] = [f"r{i}" for i in range(len(requests)) if draw(st.booleans())]
        config.append(entry)
    spec: dict[str, Any] = {"devices": {"requests": requests, **({"config": config} if config else {})}}
    meta = {"name": "claim", "namespace": draw(st.sampled_from(CLAIM_NAMESPACES))}
    if draw(st.booleans()):
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": meta,
                "spec": {"spec": spec}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta, "spec": spec}
