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

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from .kube import ApiUnavailable, Forbidden, KubeApi, KubeError

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


class TtlCache:
    """A thread-safe map whose entries expire; bounded (cleared when full)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_entries: int = 4096) -> None:
        self.clock = clock
        self.max_entries = max_entries
        self.entries: dict[Hashable, tuple[float, Any]] = {}
        self.lock = threading.Lock()

    def get(self, key: Hashable) -> Any | None:
        with self.lock:
            found = self.entries.get(key)
            if found is None:
                return None
            if found[0] <= self.clock():
                del self.entries[key]
                return None
            return found[1]

    def put(self, key: Hashable, value: Any, ttl: float) -> None:
        with self.lock:
            if len(self.entries) >= self.max_entries:
                self.entries.clear()
            self.entries[key] = (self.clock() + ttl, value)


class ApiFacts:
    """Facts from the API. `ttl`: seconds an answer is reused; `error_ttl`: seconds a failure is (so an
    unreachable apiserver costs one timeout per lookup and `error_ttl`, not one per admission request)."""

    online = True

    def __init__(self, api: KubeApi, ttl: float = 30.0, error_ttl: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.ttl = ttl
        self.error_ttl = error_ttl
        self.cache = TtlCache(clock)

    def _cached(self, key: Hashable, what: str, ask: Callable[[], Any]) -> Fact[Any]:
        found = self.cache.get(key)
        if found is not None:
            return found  # type: ignore[no-any-return]
        try:
            fact: Fact[Any] = Fact(known=True, value=ask())
            ttl = self.ttl
        except Forbidden:
            fact, ttl = Fact(note=f"no permission to read {what}"), self.ttl
        except ApiUnavailable:
            fact, ttl = Fact(note="API unreachable"), self.error_ttl
        except KubeError as exc:
            fact, ttl = Fact(note=f"API error {exc.status} reading {what}"), self.error_ttl
        self.cache.put(key, fact, ttl)
        return fact

    def configmap_keys(self, namespace: str, name: str) -> Fact[frozenset[str]]:
        return self._cached(("cm", namespace, name), "ConfigMaps", lambda: self.api.read_configmap(namespace, name))

    def pod_security_enforce(self, namespace: str) -> Fact[str]:
        def ask() -> str:
            labels = self.api.read_namespace(namespace)
            return str((labels or {}).get(ENFORCE_LABEL, ""))

        return self._cached(("ns", namespace), "namespaces", ask)

    def node_label(self, node: str, label: str) -> Fact[str]:
        labels = self._cached(("node", node), "nodes", lambda: self.api.read_node(node))
        if not labels.known:
            return labels
        if labels.value is None:
            return Fact(note=f"node {node} not found")
        value = labels.value.get(label)
        return Fact(known=True, value=None if value is None else str(value))
