"""The GPU Operator's own objects, admitted because they are the operator's, not because their namespace is
exempt (docs/gpu-operator.md, "The operator's own pods").

The operator runs privileged DaemonSets with `runtimeClassName: nvidia` (device plugin, GFD, DCGM exporter,
validator, MIG manager) and, in NRI mode, annotates their management containers with
`nvidia.cdi.k8s.io/container.<name>: management.nvidia.com/gpu=all`: exactly what GPU003, GPU007 and GPU011
refuse in a user's pod. An object is the operator's when it is in the operator's namespace (the ClusterPolicy's
`status.namespace`) and either
- a workload the operator's ServiceAccount writes whose controller is the ClusterPolicy (the operator sets it:
  gpu-operator v26.7.0 controllers/object_controls.go, controllerutil.SetControllerReference on every
  DaemonSet), or
- a Pod the DaemonSet controller creates whose controller is a DaemonSet that the ClusterPolicy controls: the
  DaemonSet is looked up (`facts.daemonset`) and its uid must be the one the pod names.
Who sent the request comes from the API server (`userInfo`), so no pod spec can claim it; a user's pod in the
operator's namespace is judged like any other. Pure: the DaemonSet comes through `ClusterFacts`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_stack_webhook.policy.config import GpuOperatorIdentity
from gpu_stack_webhook.policy.facts import ClusterFacts

CLUSTER_POLICY_API_VERSION = "nvidia.com/v1"
# kube-controller-manager's DaemonSet controller: with --use-service-account-credentials (kubeadm's default)
# its own ServiceAccount, otherwise the controller manager's user.
DAEMONSET_CONTROLLER_USERS = frozenset({"system:serviceaccount:kube-system:daemon-set-controller",
                                        "system:kube-controller-manager"})


def controller_of(metadata: Any) -> Mapping[str, Any] | None:
    """The ownerReference with `controller: true`, if any."""
    refs = metadata.get("ownerReferences") if isinstance(metadata, Mapping) else None
    for ref in refs if isinstance(refs, list) else ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def _is_cluster_policy(ref: Mapping[str, Any] | None, operator: GpuOperatorIdentity) -> bool:
    if ref is None or ref.get("apiVersion") != CLUSTER_POLICY_API_VERSION or ref.get("kind") != "ClusterPolicy":
        return False
    uid = operator.cluster_policy_uid
    return ref.get("name") == operator.cluster_policy and (not uid or ref.get("uid") == uid)


def operator_owned(operator: GpuOperatorIdentity | None, username: str, kind: str, namespace: str, *,
                   obj: Mapping[str, Any], facts: ClusterFacts) -> str:
    """Why `obj` is the GPU Operator's own ("" when it is not)."""
    if operator is None or namespace != operator.namespace:
        return ""
    metadata = obj.get("metadata")
    controller = controller_of(metadata)
    if kind != "Pod":
        if username == f"system:serviceaccount:{operator.namespace}:{operator.service_account}" and \
                _is_cluster_policy(controller, operator):
            return f"written by the GPU Operator for ClusterPolicy {operator.cluster_policy}"
        return ""
    if username not in DAEMONSET_CONTROLLER_USERS or controller is None or controller.get("kind") != "DaemonSet" \
            or controller.get("apiVersion") != "apps/v1":
        return ""
    name = str(controller.get("name") or "")
    daemonset = facts.daemonset(namespace, name)
    if not daemonset.known or not isinstance(daemonset.value, Mapping):
        return ""
    if daemonset.value.get("uid") != controller.get("uid") or \
            not _is_cluster_policy(controller_of(daemonset.value), operator):
        return ""
    return f"a pod of DaemonSet {name}, which ClusterPolicy {operator.cluster_policy} controls"
