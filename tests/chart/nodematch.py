"""Would the DaemonSet controller run a pod of this template on a node with these labels?

The controller runs a DaemonSet pod on a node only while the pod's nodeSelector and required node
affinity match the node's labels, and deletes it once they stop matching (that is how the MIG
manager's nvidia.com/gpu.deploy.<component>=paused-for-mig-change takes GPU clients off a node).
Operators as in k8s.io/component-helpers/scheduling/corev1/nodeaffinity.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _expression_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        if key not in labels:
            return False
        have, want = int(labels[key]), int(values[0])
        return have > want if op == "Gt" else have < want
    raise ValueError(f"unknown operator {op}")


def runs_on(pod_spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return True
    return any(all(_expression_matches(e, labels) for e in term.get("matchExpressions") or [])
               for term in required["nodeSelectorTerms"])
