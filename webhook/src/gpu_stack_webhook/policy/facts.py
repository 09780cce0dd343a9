"""What the policy may learn from the cluster, behind a small interface (`ClusterFacts`).

The engine stays pure: rules ask `ctx.facts` and get a `Fact` that is either known or unknown. Offline
(`gpu-stack-webhook check`, tests, lookups switched off) every fact is unknown and quiet, so decisions
are exactly the offline ones. `ApiFacts` answers from the Kubernetes API through `KubeApi`, with a small
TTL cache (the admission path pays for an API call at most once per TTL and object) and the adapter's
short request timeout; when the API cannot be asked the fact is unknown with a note that the rules put
in a warning ("not checked: ...") and the decision falls back to the offline behaviour.

Seven facts exist: the keys of a ConfigMap (never a Secret: the webhook has no right to read them),
the Pod Security level a namespace enforces, one label of a node (the device plugin config label
of the node a pod is pinned to with spec.nodeName), a ResourceClaim or ResourceClaimTemplate a pod
names (Dynamic Resource Allocation: which of its requests are GPUs, policy/dra.py), the handler of a
RuntimeClass (policy/runtime_classes.py), and the owner of a DaemonSet (policy/operator_owned.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
# Pod Security levels that forbid hostIPC (https://kubernetes.io/docs/concepts/security/pod-security-standards/).
FORBID_HOST_IPC = frozenset({"baseline", "restricted"})


@dataclass(frozen=True, slots=True)
class Fact(Generic[T]):
    known: bool = False
    value: T | None = None
    # Why it is unknown, for a warning; "" means offline on purpose (nothing to say).
    note: str = ""


UNKNOWN: Fact[Any] = Fact()


class AskingRule:
    """Which rule is being evaluated: a lookup that cannot be made (kube/lookups.py, an API the server does not
    serve) names the rule it cannot serve in its log line. policy/engine.py sets one per evaluation in
    ASKING_RULE and writes each rule's ID into it before running the rule: an attribute write per rule, where
    setting and resetting the context variable around every rule cost about a tenth of an evaluation."""

    __slots__ = ("rule",)

    def __init__(self, rule: str = "") -> None:
        self.rule = rule


ASKING_RULE: ContextVar[AskingRule | None] = ContextVar("asking_rule", default=None)


def asking_rule() -> str:
    """The ID of the rule being evaluated in this context; "" outside a rule."""
    asking = ASKING_RULE.get()
    return asking.rule if asking is not None else ""


class ClusterFacts(Protocol):
    online: bool

    def configmap_keys(self, namespace: str, name: str) -> Fact[frozenset[str]]:
        """Known with value None: the ConfigMap does not exist."""
        ...

    def pod_security_enforce(self, namespace: str) -> Fact[str]:
        """The namespace's enforced Pod Security level; "" when it sets none (or does not exist)."""
        ...

    def node_label(self, node: str, label: str) -> Fact[str]:
        """The value of `label` on `node`: known with value None when the node has no such label;
        unknown (with a note) when the node does not exist or cannot be read."""
        ...

    def resource_claim(self, namespace: str, name: str) -> Fact[dict[str, Any]]:
        """The ResourceClaim object (read only); known with value None when it does not exist."""
        ...

    def resource_claim_template(self, namespace: str, name: str) -> Fact[dict[str, Any]]:
        """The ResourceClaimTemplate object (read only); known with value None when it does not exist."""
        ...

    def runtime_class_handler(self, name: str) -> Fact[str]:
        """The handler of RuntimeClass `name`; known with value None when it does not exist."""
        ...

    def daemonset(self, namespace: str, name: str) -> Fact[dict[str, Any]]:
        """The DaemonSet's metadata (uid, ownerReferences); known with value None when it does not exist."""
        ...


class OfflineFacts:
    online = False

    def configmap_keys(self, namespace: str, name: str) -> Fact[frozenset[str]]:
        return UNKNOWN

    def pod_security_enforce(self, namespace: str) -> Fact[str]:
        return UNKNOWN

    def node_label(self, node: str, label: str) -> Fact[str]:
        return UNKNOWN

    def resource_claim(self, namespace: str, name: str) -> Fact[dict[str, Any]]:
        return UNKNOWN

    def resource_claim_template(self, namespace: str, name: str) -> Fact[dict[str, Any]]:
        return UNKNOWN

    def runtime_class_handler(self, name: str) -> Fact[str]:
        return UNKNOWN

    def daemonset(self, namespace: str, name: str) -> Fact[dict[str, Any]]:
        return UNKNOWN


OFFLINE: ClusterFacts = OfflineFacts()


class DocumentFacts(OfflineFacts):
    """Offline, except for the ResourceClaims and ResourceClaimTemplates given (`gpu-stack-webhook check`:
    the other documents of the same input). `online` stays False: every other fact is unknown and quiet,
    exactly as offline; a claim the input does not hold is unknown with a note saying so."""

    def __init__(self, objects: Iterable[Any], default_namespace: str) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        for obj in objects:
            if not isinstance(obj, dict) or obj.get("kind") not in ("ResourceClaim", "ResourceClaimTemplate"):
                continue
            meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
            assert isinstance(meta, dict)
            namespace = str(meta.get("namespace") or default_namespace)
            self.objects[(str(obj["kind"]), namespace, str(meta.get("name") or ""))] = obj

    def _find(self, kind: str, namespace: str, name: str) -> Fact[dict[str, Any]]:
        found = self.objects.get((kind, namespace, name))
        if found is None:
            return Fact(note=f"{kind} {namespace}/{name} is not in the input")
        return Fact(known=True, value=found)

    def resource_claim(self, namespace: str, name: str) -> Fact[dict[str, Any]]:
        return self._find("ResourceClaim", namespace, name)

    def resource_claim_template(self, namespace: str, name: str) -> Fact[dict[str, Any]]:
        return self._find("ResourceClaimTemplate", namespace, name)
