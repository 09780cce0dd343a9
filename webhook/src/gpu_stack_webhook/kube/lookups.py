"""`ApiFacts`: the policy's `ClusterFacts` answered from the Kubernetes API, with a small TTL cache.

The admission path pays for an API call at most once per TTL and object, with the adapter's short
request timeout; when the API cannot be asked the fact is unknown with a note for the rules' warnings. An API
the server does not serve at all (resource.k8s.io/v1 before Kubernetes 1.34, or DRA switched off) is asked once
per TTL for all its objects, and logged once per API and rule that cannot be applied (tests/webhook/
test_kube_not_served.py; on the real 1.32 API server: tests/e2e/test_kubernetes_minors.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from gpu_stack_webhook.kube.client import ApiUnavailable, Forbidden, KubeApi, KubeError, NotServed
from gpu_stack_webhook.policy.facts import ENFORCE_LABEL, Fact, OfflineFacts, asking_rule

log = logging.getLogger("gpu_stack_webhook.kube.lookups")


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
        # An API the server does not serve (kube.client.NotServed), by the resource asked: its note, until when it
        # is not asked again (one request per TTL for the whole API, not one per object), and the rules whose
        # failure to apply was logged (one line per API and rule, not one per request).
        self.not_served: dict[str, tuple[float, str]] = {}
        self.logged: set[tuple[str, str]] = set()
        self.lock = threading.Lock()

    def _cached(self, key: Hashable, what: str, ask: Callable[[], Any]) -> Fact[Any]:
        found = self.cache.get(key)
        if found is not None:
            if not found.known and what in self.not_served:  # another rule asking: named once too
                self._log_not_served(what, self.not_served[what][1])
            return found  # type: ignore[no-any-return]
        unserved = self.not_served.get(what)
        if unserved is not None and unserved[0] > self.cache.clock():
            self._log_not_served(what, unserved[1])
            return Fact(note=f"{unserved[1]}, so the rule cannot read {what}")
        try:
            fact: Fact[Any] = Fact(known=True, value=ask())
            ttl = self.ttl
        except Forbidden:
            fact, ttl = Fact(note=f"no permission to read {what}"), self.ttl
        except NotServed as exc:
            # Not asked again sooner than a found object: the server's version does not change within a TTL.
            self.not_served[what] = (self.cache.clock() + self.ttl, exc.message)
            self._log_not_served(what, exc.message)
            fact, ttl = Fact(note=f"{exc.message}, so the rule cannot read {what}"), self.ttl
        except ApiUnavailable:
            fact, ttl = Fact(note="API unreachable"), self.error_ttl
        except KubeError as exc:
            fact, ttl = Fact(note=f"API error {exc.status} reading {what}"), self.error_ttl
        self.cache.put(key, fact, ttl)
        return fact

    def _log_not_served(self, what: str, message: str) -> None:
        """One WARNING per API and rule: which rule cannot be applied on this API server, and why."""
        rule = asking_rule()
        if not rule:  # asked outside a rule (which requests it may act on): the rules that ask next are named
            return
        with self.lock:
            if (what, rule) in self.logged:
                return
            self.logged.add((what, rule))
        log.warning("%s: rule %s cannot be applied to the pods' %s on this API server", message, rule, what,
                    extra={"event": "api-not-served", "resource": what, "rule": rule})

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

    def resource_claim(self, namespace: str, name: str) -> Fact[dict[str, Any]]:
        return self._cached(("claim", namespace, name), "resourceclaims",
                            lambda: self.api.read_resource_claim(namespace, name))

    def resource_claim_template(self, namespace: str, name: str) -> Fact[dict[str, Any]]:
        return self._cached(("claimtemplate", namespace, name), "resourceclaimtemplates",
                            lambda: self.api.read_resource_claim_template(namespace, name))

    def runtime_class_handler(self, name: str) -> Fact[str]:
        return self._cached(("runtimeclass", name), "runtimeclasses", lambda: self.api.read_runtime_class(name))

    def daemonset(self, namespace: str, name: str) -> Fact[dict[str, Any]]:
        return self._cached(("daemonset", namespace, name), "daemonsets",
                            lambda: self.api.read_daemonset_metadata(namespace, name))


class OwnerFacts(OfflineFacts):
    """Offline, but for the DaemonSets that tell the GPU Operator's own pods (policy/operator_owned.py), read
    from the API like ApiFacts does: `serve --policy-source gpu-operator` without `--cluster-lookups`."""

    def __init__(self, api: KubeApi, ttl: float = 30.0) -> None:
        self.lookups = ApiFacts(api, ttl=ttl)

    def daemonset(self, namespace: str, name: str) -> Fact[dict[str, Any]]:
        return self.lookups.daemonset(namespace, name)
