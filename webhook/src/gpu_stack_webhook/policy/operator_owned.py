"""The GPU Operator's own objects, admitted because they are the operator's, not because their namespace is
exempt, and never borrowed by anyone else (docs/gpu-operator.md, "The operator's own pods").

The operator runs privileged DaemonSets with `runtimeClassName: nvidia` (device plugin, GFD, DCGM exporter,
validator, MIG manager) and, in NRI mode, annotates their management containers with
`nvidia.cdi.k8s.io/container.<name>: management.nvidia.com/gpu=all`: exactly what GPU003, GPU007 and GPU011
refuse in a user's pod. An object is the operator's when it is in the operator's namespace (the ClusterPolicy's
`status.namespace`) and either
- a workload the operator's ServiceAccount writes whose controller is the ClusterPolicy (the operator sets it:
  gpu-operator v26.7.0 controllers/object_controls.go, controllerutil.SetControllerReference on every
  DaemonSet), or
- a Pod the DaemonSet controller creates whose controller is a DaemonSet that the ClusterPolicy controls: the
  DaemonSet is looked up (`facts.daemonset`) and its uid must be the one the pod names, or
- a Pod the validator's ServiceAccount (`nvidia-operator-validator`, assets/state-operator-validation) sends
  whose owner references are those of the live DaemonSet `nvidia-operator-validator`, which the ClusterPolicy
  controls: the validator builds its CUDA and device-plugin workload pods itself (cmd/nvidia-validator/main.go
  at v26.7.0, CUDA.runWorkload and Plugin.runWorkload: lines 1564-1626 and 1300-1373) and copies that
  DaemonSet's owner references onto them (`pod.SetOwnerReferences(validatorDaemonset.OwnerReferences)`,
  main.go:1600 and :1336), so their controller is the ClusterPolicy itself.
Who sent the request comes from the API server (`userInfo`), so no pod spec can claim it; a user's pod in the
operator's namespace is judged like any other.

Borrowing (`borrowed`): an object that names the ClusterPolicy as its controller (whatever uid, in any namespace:
the operator writes only in its own), or a Pod of the operator's namespace whose controller is a DaemonSet the
ClusterPolicy controls, is written only by who writes it above. Anyone else may change its metadata (labels,
annotations, finalizers; the garbage collector dropping its owner) and nothing more: a create, a change of its
`spec`, or a change that makes the ClusterPolicy its controller is refused, so the pods that pass as the operator's
only ever come from a spec the operator wrote. Names of field managers (`managedFields`) are not used: a client
chooses its own (`?fieldManager=`), so they prove nothing. Pure: the DaemonSets come through `ClusterFacts`.
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
# The validator's DaemonSet and its ServiceAccount (gpu-operator v26.7.0 assets/state-operator-validation/
# 0500_daemonset.yaml, 0100_service_account.yaml); main.go reads the DaemonSet by this name (:1595, :1331).
VALIDATOR = "nvidia-operator-validator"
_REF_FIELDS = ("apiVersion", "kind", "name", "uid", "controller")


def controller_of(metadata: Any) -> Mapping[str, Any] | None:
    """The ownerReference with `controller: true`, if any."""
    refs = metadata.get("ownerReferences") if isinstance(metadata, Mapping) else None
    for ref in refs if isinstance(refs, list) else ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def _names_cluster_policy(ref: Mapping[str, Any] | None, operator: GpuOperatorIdentity) -> bool:
    return ref is not None and ref.get("apiVersion") == CLUSTER_POLICY_API_VERSION and \
        ref.get("kind") == "ClusterPolicy" and ref.get("name") == operator.cluster_policy


def _is_cluster_policy(ref: Mapping[str, Any] | None, operator: GpuOperatorIdentity) -> bool:
    uid = operator.cluster_policy_uid
    return _names_cluster_policy(ref, operator) and (not uid or (ref is not None and ref.get("uid") == uid))


def _refs(metadata: Any) -> list[tuple[Any, ...]] | None:
    refs = metadata.get("ownerReferences") if isinstance(metadata, Mapping) else None
    if not isinstance(refs, list) or not all(isinstance(ref, Mapping) for ref in refs):
        return None
    return [tuple(ref.get(field) for field in _REF_FIELDS) for ref in refs]


def _operator_daemonset(operator: GpuOperatorIdentity, namespace: str, name: str, facts: ClusterFacts,
                        uid: object = None) -> Mapping[str, Any] | None:
    """The live DaemonSet `name`'s metadata when the ClusterPolicy controls it (and its uid is `uid`, if given)."""
    daemonset = facts.daemonset(namespace, name)
    if not daemonset.known or not isinstance(daemonset.value, Mapping):
        return None
    if uid is not None and daemonset.value.get("uid") != uid:
        return None
    return daemonset.value if _is_cluster_policy(controller_of(daemonset.value), operator) else None


def _daemonset_pod_of(operator: GpuOperatorIdentity, namespace: str, controller: Mapping[str, Any] | None,
                      facts: ClusterFacts) -> str:
    """The name of the DaemonSet the ClusterPolicy controls that is `controller` ("" when it is not one)."""
    if controller is None or controller.get("kind") != "DaemonSet" or controller.get("apiVersion") != "apps/v1":
        return ""
    name = str(controller.get("name") or "")
    return name if _operator_daemonset(operator, namespace, name, facts, controller.get("uid")) else ""


def _is_validation_pod(operator: GpuOperatorIdentity, namespace: str, metadata: Any, facts: ClusterFacts) -> bool:
    """The pod's owner references are exactly the live validator DaemonSet's, which the ClusterPolicy controls."""
    daemonset = _operator_daemonset(operator, namespace, VALIDATOR, facts)
    refs = _refs(metadata)
    return daemonset is not None and bool(refs) and refs == _refs(daemonset)


def _sa(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def operator_owned(operator: GpuOperatorIdentity | None, username: str, kind: str, namespace: str, *,
                   obj: Mapping[str, Any], facts: ClusterFacts) -> str:
    """Why `obj` is the GPU Operator's own ("" when it is not)."""
    if operator is None or namespace != operator.namespace:
        return ""
    metadata = obj.get("metadata")
    controller = controller_of(metadata)
    if kind != "Pod":
        if username == _sa(operator.namespace, operator.service_account) and _is_cluster_policy(controller, operator):
            return f"written by the GPU Operator for ClusterPolicy {operator.cluster_policy}"
        return ""
    if username == _sa(operator.namespace, VALIDATOR):
        if _is_validation_pod(operator, namespace, metadata, facts):
            return (f"a validation pod of the GPU Operator's validator, owned as DaemonSet {VALIDATOR} is, which "
                    f"ClusterPolicy {operator.cluster_policy} controls")
        return ""
    if username not in DAEMONSET_CONTROLLER_USERS:
        return ""
    name = _daemonset_pod_of(operator, namespace, controller, facts)
    return f"a pod of DaemonSet {name}, which ClusterPolicy {operator.cluster_policy} controls" if name else ""


def _claim(operator: GpuOperatorIdentity, kind: str, namespace: str, obj: Mapping[str, Any] | None,
           facts: ClusterFacts) -> str:
    """What of the operator's `obj` passes for ("" for nothing)."""
    if not isinstance(obj, Mapping):
        return ""
    controller = controller_of(obj.get("metadata"))
    if _names_cluster_policy(controller, operator):
        return f"its controller is ClusterPolicy {operator.cluster_policy}"
    if kind == "Pod" and namespace == operator.namespace:
        name = _daemonset_pod_of(operator, namespace, controller, facts)
        if name:
            return f"its controller is DaemonSet {name}, which ClusterPolicy {operator.cluster_policy} controls"
    return ""


def borrowed(operator: GpuOperatorIdentity | None, username: str, operation: str, kind: str, namespace: str, *,
             obj: Mapping[str, Any], old: Mapping[str, Any] | None, facts: ClusterFacts) -> str:
    """Why this write, by someone who is not a writer `operator_owned` knows, is refused ("" when it is not):
    it would create, re-specify or newly claim an object that passes as the GPU Operator's (module docstring).
    Call it only when `operator_owned` said "" for the same request."""
    if operator is None:
        return ""
    claim = _claim(operator, kind, namespace, obj, facts)
    old_claim = _claim(operator, kind, namespace, old, facts) if operation == "UPDATE" else ""
    if not claim and not old_claim:
        return ""
    if operation != "UPDATE" or old is None:
        change = "create it"
    elif obj.get("spec") != old.get("spec"):
        change = "change its spec"
    elif claim and controller_of(obj.get("metadata")) != controller_of(old.get("metadata")):
        change = "make the operator its controller"
    else:
        return ""  # metadata only: labels, annotations, finalizers, an owner dropped
    writers = (f"the GPU Operator's ServiceAccount {_sa(operator.namespace, operator.service_account)}"
               if kind != "Pod" else "the DaemonSet controller and the GPU Operator's validator")
    return (f"{kind} {namespace}/{_name(obj, old)} passes as the GPU Operator's ({claim or old_claim}); only "
            f"{writers}, in namespace {operator.namespace}, may {change}, not {username or 'an anonymous user'} "
            f"(docs/gpu-operator.md, \"The operator's own pods\")")


def _name(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> str:
    for source in (obj, old):
        metadata = source.get("metadata") if isinstance(source, Mapping) else None
        if isinstance(metadata, Mapping):
            name = metadata.get("name") or metadata.get("generateName")
            if name:
                return str(name)
    return ""
