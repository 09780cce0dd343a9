"""What the policy may learn from the cluster, behind a small interface (`ClusterFacts`).

The engine stays pure: rules ask `ctx.facts` and get a `Fact` that is either known or unknown. Offline
(`gpu-stack-webhook check`, tests, lookups switched off) every fact is unknown and quiet, so decisions
are exactly the offline ones. `ApiFacts` answers from the Kubernetes API through `KubeApi`, with a small
TTL cache (the admission path pays for an API call at most once per TTL and object) and the adapter's
short request timeout; when the API cannot be asked the fact is unknown with a note that the rules put
in a warning ("not checked: ...") and the decision falls back to the offline behaviour.

Three facts exist: the keys of a ConfigMap (never a Secret: the webhook has no right to read them),
the Pod Security level a namespace enforces, and one label of a node (the device plugin config label
of the node a pod is pinned to with spec.nodeName).
"""

from __future__ import annotations

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


class OfflineFacts:
    online = False

    def configmap_keys(self, namespace: str, name: str) -> Fact[frozenset[str]]:
        return UNKNOWN

    def pod_security_enforce(self, namespace: str) -> Fact[str]:
        return UNKNOWN

    def node_label(self, node: str, label: str) -> Fact[str]:
        return UNKNOWN


OFFLINE: ClusterFacts = OfflineFacts()
