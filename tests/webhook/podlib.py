"""Builders for what the webhook is sent: containers, Pods, the workloads holding a pod template, and
admission.k8s.io/v1 AdmissionReview request bodies; and JSONPatch applied the way the API server does.

Plain data in, plain data out:
- `container(...)`, `make_pod(...)`, `pod_with(field, c)`: a Pod.
- `wrap(pod, kind)`, `pod_spec_of(obj, kind)`: any workload kind around a pod, and its pod spec back.
- `review(obj, ...)`: an AdmissionReview request body shaped like the recorded ones.
- `apply_patch(obj, ops)`: the object after a JSONPatch.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jsonpatch

GPU = "nvidia.com/gpu"
WORKLOAD_KINDS = ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "CronJob")
ALL_KINDS = ("Pod", *WORKLOAD_KINDS)
CONTAINER_KINDS = ("containers", "initContainers", "ephemeralContainers")
# What a user calls each container field in messages (ContainerRef.label).
CONTAINER_LABEL = {
    "containers": "container",
    "initContainers": "initContainer",
    "ephemeralContainers": "ephemeralContainer",
}

API = {
    "Pod": ("", "v1"),
    "Deployment": ("apps", "v1"),
    "ReplicaSet": ("apps", "v1"),
    "StatefulSet": ("apps", "v1"),
    "DaemonSet": ("apps", "v1"),
    "Job": ("batch", "v1"),
    "CronJob": ("batch", "v1"),
}
RESOURCE = {
    "Pod": "pods",
    "Deployment": "deployments",
    "ReplicaSet": "replicasets",
    "StatefulSet": "statefulsets",
    "DaemonSet": "daemonsets",
    "Job": "jobs",
    "CronJob": "cronjobs",
}
# Field path (kubectl style) of the pod spec / pod metadata, per kind.
SPEC_PATH = {
    "Pod": "spec",
    **{k: "spec.template.spec" for k in WORKLOAD_KINDS},
    "CronJob": "spec.jobTemplate.spec.template.spec",
}
META_PATH = {
    "Pod": "metadata",
    **{k: "spec.template.metadata" for k in WORKLOAD_KINDS},
    "CronJob": "spec.jobTemplate.spec.template.metadata",
}


def container(
    name: str = "main",
    *,
    gpu: Any = None,
    requests: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    env: Sequence[Mapping[str, Any]] | None = None,
    env_from: Sequence[Mapping[str, Any]] | None = None,
    privileged: bool | None = None,
    mounts: Sequence[str | Mapping[str, Any]] | None = None,
    image: str = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
    **extra: Any,
) -> dict[str, Any]:
    """One container. `gpu=1` sets requests and limits of nvidia.com/gpu to the same value."""
    c: dict[str, Any] = {"name": name, "image": image, **extra}
    req, lim = dict(requests or {}), dict(limits or {})
    if gpu is not None:
        req.setdefault(GPU, gpu)
        lim.setdefault(GPU, gpu)
    if req or lim:
        c["resources"] = {}
        if req:
            c["resources"]["requests"] = req
        if lim:
            c["resources"]["limits"] = lim
    if env is not None:
        c["env"] = [dict(e) for e in env]
    if env_from is not None:
        c["envFrom"] = [dict(e) for e in env_from]
    if privileged is not None:
        c["securityContext"] = {"privileged": privileged}
    if mounts is not None:
        c["volumeMounts"] = [
            {"name": "devnull", "mountPath": m} if isinstance(m, str) else dict(m) for m in mounts
        ]
    return c


def make_pod(
    containers: Iterable[Mapping[str, Any]] = (),
    *,
    init: Iterable[Mapping[str, Any]] = (),
    ephemeral: Iterable[Mapping[str, Any]] = (),
    name: str = "gpu-pod",
    namespace: str = "gpu-demo",
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    **spec_fields: Any,
) -> dict[str, Any]:
    """A Pod. With no containers given it has one plain non-GPU container "main".

    Extra keyword arguments become pod spec fields (nodeSelector=..., tolerations=..., hostIPC=...)."""
    conts = [dict(c) for c in containers] or [container("main")]
    spec: dict[str, Any] = {"containers": conts}
    if init := [dict(c) for c in init]:
        spec["initContainers"] = init
    if ephemeral := [dict(c) for c in ephemeral]:
        spec["ephemeralContainers"] = ephemeral
    spec.update(spec_fields)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def pod_with(field: str, c: Mapping[str, Any], **pod_kw: Any) -> dict[str, Any]:
    """A Pod whose `field` (containers | initContainers | ephemeralContainers) holds `c` at index 0.

    For init and ephemeral containers the pod also gets a plain main container "app"; pass
    `main=container(...)` to choose it (e.g. to make the pod a GPU pod)."""
    main = pod_kw.pop("main", None) or container("app")
    if field == "containers":
        return make_pod([c], **pod_kw)
    if field == "initContainers":
        return make_pod([main], init=[c], **pod_kw)
    if field == "ephemeralContainers":
        return make_pod([main], ephemeral=[c], **pod_kw)
    raise ValueError(f"unknown container field {field}")  # pragma: no cover


def wrap(pod: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The Pod itself for kind "Pod", else a workload of `kind` whose pod template is this pod.

    The pod's labels and annotations move to the template metadata (where they reach the pods);
    the workload object gets the pod's name and namespace."""
    pod = copy.deepcopy(dict(pod))
    if kind == "Pod":
        return pod
    meta = pod.get("metadata", {})
    name, namespace = meta.get("name", "gpu-workload"), meta.get("namespace", "gpu-demo")
    template_meta = {k: v for k, v in meta.items() if k in ("labels", "annotations")}
    template_meta.setdefault("labels", {"app": name})
    template = {"metadata": template_meta, "spec": pod["spec"]}
    group, version = API[kind]
    obj: dict[str, Any] = {
        "apiVersion": f"{group}/{version}",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
    }
    selector = {"matchLabels": dict(template_meta["labels"])}
    if kind in ("Deployment", "ReplicaSet", "DaemonSet"):
        obj["spec"] = {"selector": selector, "template": template}
    elif kind == "StatefulSet":
        obj["spec"] = {"selector": selector, "serviceName": name, "template": template}
    elif kind == "Job":
        template["spec"].setdefault("restartPolicy", "Never")
        obj["spec"] = {"template": template}
    elif kind == "CronJob":
        template["spec"].setdefault("restartPolicy", "Never")
        obj["spec"] = {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": template}}}
    else:  # pragma: no cover - a typo in a test table
        raise ValueError(f"unknown kind {kind}")
    return obj


def pod_spec_of(obj: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The (mutable) pod spec inside an object built by `wrap`."""
    node: Any = obj
    for key in SPEC_PATH[kind].split("."):
        node = node[key]
    return node  # type: ignore[no-any-return]


def review(
    obj: Mapping[str, Any] | None,
    *,
    kind: str | None = None,
    operation: str = "CREATE",
    old: Mapping[str, Any] | None = None,
    namespace: str | None = None,
    sub_resource: str | None = None,
    uid: str | None = None,
    dry_run: bool = False,
    group: str | None = None,
) -> dict[str, Any]:
    """An admission.k8s.io/v1 AdmissionReview request body, shaped like the recorded ones."""
    source = obj if obj is not None else old
    kind = kind or (source or {}).get("kind", "Pod")
    grp, version = API.get(kind, (group or "", "v1"))
    if group is not None:
        grp = group
    meta = (source or {}).get("metadata", {})
    resource = RESOURCE.get(kind, kind.lower() + "s")
    request: dict[str, Any] = {
        "uid": uid or str(uuid.uuid4()),
        "kind": {"group": grp, "version": version, "kind": kind},
        "resource": {"group": grp, "version": version, "resource": resource},
        "name": meta.get("name", ""),
        "namespace": namespace if namespace is not None else meta.get("namespace", "gpu-demo"),
        "operation": operation,
        "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
        "object": copy.deepcopy(obj) if obj is not None else None,
        "oldObject": copy.deepcopy(old) if old is not None else None,
        "dryRun": dry_run,
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def apply_patch(obj: Mapping[str, Any], ops: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Apply JSONPatch ops (RFC 6902) the way the apiserver does; the input is not modified."""
    return jsonpatch.JsonPatch([dict(op) for op in ops]).apply(copy.deepcopy(dict(obj)))  # type: ignore[no-any-return]


# --- Dynamic Resource Allocation (resource.k8s.io/v1) ----------------------------------------------------


def claim_spec(*requests: Mapping[str, Any], config: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A ResourceClaimSpec with these requests (see `exactly`) and opaque config entries."""
    devices: dict[str, Any] = {"requests": [dict(r) for r in requests]}
    if config:
        devices["config"] = [dict(c) for c in config]
    return {"devices": devices}


def exactly(name: str = "gpu", device_class: str = "gpu.nvidia.com", **fields: Any) -> dict[str, Any]:
    """One request: {name, exactly: {deviceClassName, ...fields}} (allocationMode=..., adminAccess=...)."""
    return {"name": name, "exactly": {"deviceClassName": device_class, **fields}}


def gpu_config(sharing: Any, kind: str = "GpuConfig", requests: Sequence[str] = ()) -> dict[str, Any]:
    """An opaque config entry for the NVIDIA driver (GpuConfig sharing ...)."""
    entry: dict[str, Any] = {"opaque": {"driver": "gpu.nvidia.com", "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": kind, "sharing": sharing}}}
    if requests:
        entry["requests"] = list(requests)
    return entry


def resource_claim(spec: Mapping[str, Any], name: str = "gpu-claim", namespace: str = "gpu-demo",
                   template: bool = False) -> dict[str, Any]:
    """A ResourceClaim, or (template=True) a ResourceClaimTemplate holding `spec`."""
    metadata = {"name": name, "namespace": namespace}
    if template:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": metadata,
                "spec": {"spec": dict(spec)}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": metadata, "spec": dict(spec)}


def with_claims(c: Mapping[str, Any], *names: str) -> dict[str, Any]:
    """The container with resources.claims naming these pod claims."""
    out = dict(c)
    out["resources"] = {**dict(out.get("resources") or {}), "claims": [{"name": n} for n in names]}
    return out


def claim_ref(name: str = "gpu", claim: str = "", template: str = "") -> dict[str, Any]:
    """A spec.resourceClaims entry (resourceClaimName or resourceClaimTemplateName)."""
    return {"name": name, **({"resourceClaimName": claim} if claim else {"resourceClaimTemplateName": template})}
