"""An in-memory KubeApi with the apiserver's semantics the webhook relies on, and the same fake served
over HTTPS as a tiny apiserver (for a real `gpu-stack-webhook serve` in a subprocess).

- Secrets: create -> AlreadyExists when present; replace -> Conflict unless the resourceVersion is the
  current one; every write bumps a global resourceVersion.
- Webhook configurations: read; a strategic-merge caBundle patch by webhook name (unknown names are
  an Invalid error, like a merge patch that would drop required fields).
- Namespaces (labels) and ConfigMaps (keys).
- `fail_next[...]` / `unreachable` inject errors; `calls` records every call (method, args).
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from gpu_stack_webhook.kube.client import (
    MUTATING,
    VALIDATING,
    AlreadyExists,
    ApiUnavailable,
    Conflict,
    Invalid,
    KubeError,
)
from gpu_stack_webhook.kube.objects import SecretObject, WebhookConfiguration, ca_bundle_patch

from .tls_helpers import Pki, serving_https


class FakeKube:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.version = 100
        self.secrets: dict[tuple[str, str], SecretObject] = {}
        self.configs: dict[tuple[str, str], WebhookConfiguration] = {}
        self.namespaces: dict[str, dict[str, str]] = {}
        self.configmaps: dict[tuple[str, str], frozenset[str]] = {}
        self.nodes: dict[str, dict[str, str]] = {}
        # (namespace, name) -> object, for ResourceClaims and ResourceClaimTemplates
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.claim_templates: dict[tuple[str, str], dict[str, Any]] = {}
        # The GPU Operator's ClusterPolicies by name, and ConfigMap data (device plugin configs)
        self.cluster_policies: dict[str, dict[str, Any]] = {}
        self.configmap_data: dict[tuple[str, str], dict[str, str]] = {}
        # RuntimeClass name -> handler; (namespace, name) -> DaemonSet metadata
        self.runtime_classes: dict[str, str] = {}
        self.daemonsets: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.unreachable = False
        # method name -> errors raised by its next calls (in order)
        self.fail_next: dict[str, list[KubeError]] = {}

    # --- setup helpers
    def add_webhook_configuration(self, kind: str, name: str, webhook_names: Sequence[str]) -> None:
        with self.lock:
            self.version += 1
            self.configs[(kind, name)] = WebhookConfiguration(kind, name, f"uid-{kind}-{name}",
                                                              {n: b"" for n in webhook_names})

    def _bump(self) -> str:
        self.version += 1
        return str(self.version)

    def _enter(self, method: str, *args: Any) -> None:
        self.calls.append((method, args))
        if self.unreachable:
            raise ApiUnavailable(0, "Unreachable", "connection refused")
        queued = self.fail_next.get(method)
        if queued:
            raise queued.pop(0)

    def count(self, method: str) -> int:
        return sum(1 for m, _ in self.calls if m == method)

    # --- KubeApi
    def read_secret(self, namespace: str, name: str) -> SecretObject | None:
        with self.lock:
            self._enter("read_secret", namespace, name)
            return self.secrets.get((namespace, name))

    def create_secret(self, secret: SecretObject) -> SecretObject:
        with self.lock:
            self._enter("create_secret", secret.namespace, secret.name)
            key = (secret.namespace, secret.name)
            if key in self.secrets:
                raise AlreadyExists(409, "AlreadyExists", f'secrets "{secret.name}" already exists')
            stored = replace(secret, resource_version=self._bump(), uid=f"uid-{secret.name}")
            self.secrets[key] = stored
            return stored

    def replace_secret(self, secret: SecretObject) -> SecretObject:
        with self.lock:
            self._enter("replace_secret", secret.namespace, secret.name)
            key = (secret.namespace, secret.name)
            current = self.secrets.get(key)
            if current is None:
                raise KubeError(404, "NotFound", f'secrets "{secret.name}" not found')
            if secret.resource_version != current.resource_version:
                raise Conflict(409, "Conflict", f'Operation cannot be fulfilled on secrets "{secret.name}": '
                               "the object has been modified; please apply your changes to the latest version "
                               "and try again")
            stored = replace(secret, resource_version=self._bump(), uid=current.uid)
            self.secrets[key] = stored
            return stored

    def read_webhook_configuration(self, kind: str, name: str) -> WebhookConfiguration | None:
        with self.lock:
            self._enter("read_webhook_configuration", kind, name)
            return self.configs.get((kind, name))

    def patch_ca_bundle(self, kind: str, name: str, webhook_names: Sequence[str], ca_bundle: bytes
                        ) -> WebhookConfiguration:
        with self.lock:
            self._enter("patch_ca_bundle", kind, name, tuple(webhook_names))
            config = self.configs.get((kind, name))
            if config is None:
                raise KubeError(404, "NotFound", f"{kind} {name} not found")
            unknown = set(webhook_names) - set(config.ca_bundles)
            if unknown:
                raise Invalid(422, "Invalid", f"unknown webhooks {sorted(unknown)}")
            bundles = {**config.ca_bundles, **{n: ca_bundle for n in webhook_names}}
            self.version += 1
            self.configs[(kind, name)] = replace(config, ca_bundles=bundles)
            return self.configs[(kind, name)]

    def read_namespace(self, name: str) -> Mapping[str, str] | None:
        with self.lock:
            self._enter("read_namespace", name)
            labels = self.namespaces.get(name)
            return None if labels is None else dict(labels)

    def read_node(self, name: str) -> Mapping[str, str] | None:
        with self.lock:
            self._enter("read_node", name)
            labels = self.nodes.get(name)
            return None if labels is None else dict(labels)

    def read_resource_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            self._enter("read_resource_claim", namespace, name)
            return self.claims.get((namespace, name))

    def read_resource_claim_template(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            self._enter("read_resource_claim_template", namespace, name)
            return self.claim_templates.get((namespace, name))

    def read_configmap(self, namespace: str, name: str) -> frozenset[str] | None:
        with self.lock:
            self._enter("read_configmap", namespace, name)
            return self.configmaps.get((namespace, name))

    def read_configmap_data(self, namespace: str, name: str) -> dict[str, str] | None:
        with self.lock:
            self._enter("read_configmap_data", namespace, name)
            data = self.configmap_data.get((namespace, name))
            return None if data is None else dict(data)

    def read_cluster_policy(self, name: str) -> dict[str, Any] | None:
        with self.lock:
            self._enter("read_cluster_policy", name)
            return self.cluster_policies.get(name)

    def read_runtime_class(self, name: str) -> str | None:
        with self.lock:
            self._enter("read_runtime_class", name)
            return self.runtime_classes.get(name)

    def list_runtime_classes(self) -> dict[str, str]:
        with self.lock:
            self._enter("list_runtime_classes")
            return dict(self.runtime_classes)

    def read_daemonset_metadata(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            self._enter("read_daemonset_metadata", namespace, name)
            return self.daemonsets.get((namespace, name))


def standard_fake(namespace: str = "gpu-stack", mutating: str = "gpu-stack-webhook",
                  validating: str = "gpu-stack-webhook") -> FakeKube:
    """A fake with the two webhook configurations the chart renders."""
    fake = FakeKube()
    fake.add_webhook_configuration(MUTATING, mutating, ["mutate.gpu-stack.io"])
    fake.add_webhook_configuration(VALIDATING, validating, ["validate.gpu-stack.io"])
    fake.namespaces[namespace] = {"kubernetes.io/metadata.name": namespace}
    return fake


# --------------------------------------------------------------------------------------------------
# The fake over HTTPS (the paths and bodies the `kubernetes` client uses)
# --------------------------------------------------------------------------------------------------

_SECRET = re.compile(r"^/api/v1/namespaces/([^/]+)/secrets(?:/([^/]+))?$")
_CONFIG = re.compile(r"^/apis/admissionregistration\.k8s\.io/v1/(mutating|validating)webhookconfigurations/([^/]+)$")
_NAMESPACE = re.compile(r"^/api/v1/namespaces/([^/]+)$")
_CONFIGMAP = re.compile(r"^/api/v1/namespaces/([^/]+)/configmaps/([^/]+)$")
_NODE = re.compile(r"^/api/v1/nodes/([^/]+)$")
_CLAIM = re.compile(r"^/apis/resource.k8s.io/v1/namespaces/([^/]+)/(resourceclaims|resourceclaimtemplates)/([^/]+)$")


def _status(error: KubeError) -> tuple[int, dict[str, Any]]:
    code = error.status or 503
    return code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                  "message": error.message, "reason": error.reason, "code": code}


def _not_found(what: str) -> tuple[int, dict[str, Any]]:
    return 404, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                 "message": f"{what} not found", "reason": "NotFound", "code": 404}


def _config_body(config: WebhookConfiguration) -> dict[str, Any]:
    return {
        "kind": config.kind, "apiVersion": "admissionregistration.k8s.io/v1",
        "metadata": {"name": config.name, "uid": config.uid},
        "webhooks": [{"name": n, "clientConfig": {"caBundle": base64.b64encode(b).decode()} if b else {}}
                     for n, b in config.ca_bundles.items()],
    }


def handle(fake: FakeKube, method: str, path: str, content_type: str | None, body: Any) -> tuple[int, Any]:
    try:
        if m := _SECRET.match(path):
            ns, name = m.groups()
            if method == "GET" and name:
                found = fake.read_secret(ns, name)
                return (200, found.to_body()) if found else _not_found(f'secrets "{name}"')
            if method == "POST" and not name:
                return 201, fake.create_secret(SecretObject.from_body(body)).to_body()
            if method == "PUT" and name:
                return 200, fake.replace_secret(SecretObject.from_body(body)).to_body()
        if m := _CONFIG.match(path):
            kind = MUTATING if m.group(1) == "mutating" else VALIDATING
            name = m.group(2)
            if method == "GET":
                found_config = fake.read_webhook_configuration(kind, name)
                return (200, _config_body(found_config)) if found_config else _not_found(name)
            if method == "PATCH":
                if content_type != "application/strategic-merge-patch+json":
                    return 422, {"kind": "Status", "reason": "Invalid", "code": 422,
                                 "message": f"only strategic merge patches are served here, not {content_type}"}
                hooks = body["webhooks"]
                bundle = base64.b64decode(hooks[0]["clientConfig"]["caBundle"])
                names = [h["name"] for h in hooks]
                assert body == ca_bundle_patch(names, bundle)
                return 200, _config_body(fake.patch_ca_bundle(kind, name, names, bundle))
        if (m := _CONFIGMAP.match(path)) and method == "GET":
            keys = fake.read_configmap(*m.groups())
            if keys is None:
                return _not_found(f'configmaps "{m.group(2)}"')
            return 200, {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": m.group(2)},
                         "data": {k: "x" for k in keys}}
        if (m := _NODE.match(path)) and method == "GET":
            node_labels = fake.read_node(m.group(1))
            if node_labels is None:
                return _not_found(f'nodes "{m.group(1)}"')
            return 200, {"kind": "Node", "apiVersion": "v1", "metadata": {"name": m.group(1), "labels": node_labels}}
        if (m := _CLAIM.match(path)) and method == "GET":
            namespace, plural, claim_name = m.groups()
            read = fake.read_resource_claim if plural == "resourceclaims" else fake.read_resource_claim_template
            found_claim = read(namespace, claim_name)
            return (200, found_claim) if found_claim is not None else _not_found(f'{plural} "{claim_name}"')
        if (m := _NAMESPACE.match(path)) and method == "GET":
            labels = fake.read_namespace(m.group(1))
            if labels is None:
                return _not_found(f'namespaces "{m.group(1)}"')
            return 200, {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": m.group(1), "labels": labels}}
    except KubeError as exc:
        return _status(exc)
    return 404, {"kind": "Status", "reason": "NotFound", "code": 404, "message": f"no route {method} {path}"}


@contextlib.contextmanager
def fake_apiserver(fake: FakeKube, pki: Pki) -> Iterator[str]:
    """Serve `fake` over HTTPS on 127.0.0.1; yields the base URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            status, payload = handle(fake, self.command, urlsplit(self.path).path, self.headers.get("Content-Type"),
                                     json.loads(raw) if raw else None)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = _serve

        def log_message(self, *args: Any) -> None:
            return None

    with serving_https(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler), pki) as port:
        yield f"https://127.0.0.1:{port}"


def kubeconfig(url: str, pki: Pki) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url, "certificate-authority": str(pki.ca_cert)}}],
        "users": [{"name": "fake", "user": {"token": "fake-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
    }
