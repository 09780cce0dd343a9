"""Build the AdmissionReview requests a kube-apiserver would send, for offline checks and the demo."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from gpu_stack_webhook.admission.review import API_VERSION

PLURALS = {
    "Pod": "pods", "Deployment": "deployments", "ReplicaSet": "replicasets", "StatefulSet": "statefulsets",
    "DaemonSet": "daemonsets", "Job": "jobs", "CronJob": "cronjobs",
}


def group_version(obj: Mapping[str, Any]) -> tuple[str, str]:
    api_version = str(obj.get("apiVersion") or "v1")
    group, _, version = api_version.rpartition("/")
    return group, version


def admission_review(
    obj: Mapping[str, Any],
    *,
    operation: str = "CREATE",
    namespace: str | None = None,
    old_object: Mapping[str, Any] | None = None,
    sub_resource: str = "",
    dry_run: bool = False,
    uid: str | None = None,
) -> dict[str, Any]:
    """An admission.k8s.io/v1 AdmissionReview request for `obj`, shaped like the apiserver's."""
    group, version = group_version(obj)
    kind = str(obj.get("kind"))
    metadata = obj.get("metadata") or {}
    namespace = namespace or str(metadata.get("namespace") or "default")
    gvk = {"group": group, "version": version, "kind": kind}
    gvr = {"group": group, "version": version, "resource": PLURALS.get(kind, kind.lower() + "s")}
    request: dict[str, Any] = {
        "uid": uid or str(uuid.uuid4()),
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "gpu-stack-check", "groups": ["system:authenticated"]},
        "object": {**obj, "metadata": {**metadata, "namespace": namespace}},
        "oldObject": old_object,
        "dryRun": dry_run,
    }
    if metadata.get("name"):
        request["name"] = metadata["name"]
    if sub_resource:
        request["subResource"] = request["requestSubResource"] = sub_resource
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "request": request}
