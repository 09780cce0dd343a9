"""All the webhook's Kubernetes API access, behind one small interface (`KubeApi`).

The webhook needs very little of the API: its own TLS Secret (read, create, replace with
resourceVersion), its own two webhook configurations (read, patch `caBundle` by webhook name), and
read-only lookups for the policy (a namespace's labels, the keys of a ConfigMap). Everything else in
the package talks to `KubeApi`; tests use an in-memory fake of it, and `KubernetesClientApi` is the
one adapter over the `kubernetes` client (explicit request timeouts, no retries hidden in urllib3).

Errors: a missing object is `None` from the read methods; everything else is a `KubeError`
(`AlreadyExists` and `Conflict` for the two 409s optimistic concurrency relies on, `Forbidden`,
`Invalid`, and `ApiUnavailable` when the apiserver could not be reached or answered 5xx).

kube/connect.py's `api_client` builds the `kubernetes` ApiClient for both users of the API: `serve` (in-cluster
first) and `inspect` (the user's kubeconfig first), whose paged reads (gpuinspect/fetch.py) go through
`KubernetesClientApi.read_raw`. The `kubernetes` package is imported inside the functions that use it, and
only there: importing it takes about 0.6 s, more than the
whole rest of the CLI's start-up (about 0.5 s, `python -X importtime`), and `check`, `serve` without
self-managed TLS or lookups, and every admission request never touch it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from gpu_stack_webhook.kube.connect import api_client
from gpu_stack_webhook.kube.objects import SecretObject, WebhookConfiguration, ca_bundle_patch

MUTATING = "MutatingWebhookConfiguration"
VALIDATING = "ValidatingWebhookConfiguration"
WEBHOOK_KINDS = (MUTATING, VALIDATING)
ADMISSION_API_VERSION = "admissionregistration.k8s.io/v1"
# (connect, read) seconds for every request; lookups on the admission path use their own, shorter one.
DEFAULT_TIMEOUT = (3.0, 10.0)


class KubeError(Exception):
    """The apiserver refused a request (or could not be reached: ApiUnavailable)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else f"{reason}: {message}" if reason else message)
        self.status = status
        self.reason = reason
        self.message = message


class AlreadyExists(KubeError):
    """409 AlreadyExists: a create lost the race; re-read and use what is there."""


class Conflict(KubeError):
    """409 Conflict: a replace carried a stale resourceVersion; re-read and re-evaluate."""


class Forbidden(KubeError):
    """403: the ServiceAccount lacks a permission (the message names it)."""


class Invalid(KubeError):
    """422 Invalid: the object or patch was rejected by validation."""


class ApiUnavailable(KubeError):
    """No answer (connection refused, timeout, TLS failure) or a 5xx."""


class NotServed(KubeError):
    """404 that is not a missing object: the API server does not serve that group/version at all, as
    resource.k8s.io/v1 before Kubernetes 1.34 or with DRA switched off. A group it does not serve at all gets its
    plain-text "404 page not found"; a version it does not serve of a group it serves (resource.k8s.io/v1 on 1.32
    with the v1beta1 switched on) a Status NotFound that names no object ("the server could not find the requested
    resource", details empty). Asking again does not help: the caller says the rule cannot be applied
    (kube/lookups.py)."""


def object_not_found(body: bytes | str | None) -> bool:
    """True for the metav1.Status a served resource answers a missing object with: reason NotFound, naming the
    object (details.name), as `resourceclaims.resource.k8s.io "x" not found`."""
    try:
        parsed = json.loads(body or b"")
    except ValueError:
        return False
    if not isinstance(parsed, Mapping) or parsed.get("kind") != "Status" or parsed.get("reason") != "NotFound":
        return False
    details = parsed.get("details")
    return isinstance(details, Mapping) and bool(details.get("name"))


_BY_REASON: dict[str, type[KubeError]] = {
    "AlreadyExists": AlreadyExists,
    "Conflict": Conflict,
    "Forbidden": Forbidden,
    "Invalid": Invalid,
}


def error_from_status(status: int, body: bytes | str | None) -> KubeError:
    """A KubeError from an HTTP status and a metav1.Status body (or whatever the server sent)."""
    reason, message = "", ""
    try:
        parsed = json.loads(body or b"")
        if isinstance(parsed, Mapping):
            reason, message = str(parsed.get("reason") or ""), str(parsed.get("message") or "")
    except ValueError:
        message = (body.decode(errors="replace") if isinstance(body, bytes) else str(body or ""))[:200]
    if status >= 500 or status == 0:
        return ApiUnavailable(status, reason or "ServerError", message or "no answer")
    cls = _BY_REASON.get(reason) or {403: Forbidden, 422: Invalid}.get(status, KubeError)
    return cls(status, reason or str(status), message)


class KubeApi(Protocol):
    """The only Kubernetes access the webhook has."""

    def read_secret(self, namespace: str, name: str) -> SecretObject | None: ...

    def create_secret(self, secret: SecretObject) -> SecretObject: ...

    def replace_secret(self, secret: SecretObject) -> SecretObject: ...

    def read_webhook_configuration(self, kind: str, name: str) -> WebhookConfiguration | None: ...

    def patch_ca_bundle(
        self, kind: str, name: str, webhook_names: Sequence[str], ca_bundle: bytes
    ) -> WebhookConfiguration: ...

    def read_namespace(self, name: str) -> Mapping[str, str] | None:
        """The namespace's labels, None when it does not exist."""
        ...

    def read_configmap(self, namespace: str, name: str) -> frozenset[str] | None:
        """The keys of the ConfigMap (data and binaryData), None when it does not exist."""
        ...

    def read_node(self, name: str) -> Mapping[str, str] | None:
        """The node's labels, None when it does not exist."""
        ...

    def read_resource_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The resource.k8s.io/v1 ResourceClaim, None when it does not exist."""
        ...

    def read_configmap_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """The ConfigMap's data (the device plugin's config files), None when it does not exist."""
        ...

    def read_cluster_policy(self, name: str) -> dict[str, Any] | None:
        """The GPU Operator's ClusterPolicy (nvidia.com/v1, cluster-scoped), None when it does not exist."""
        ...

    def read_resource_claim_template(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The resource.k8s.io/v1 ResourceClaimTemplate, None when it does not exist."""
        ...

    def read_runtime_class(self, name: str) -> str | None:
        """The handler of the node.k8s.io/v1 RuntimeClass, None when it does not exist."""
        ...

    def list_runtime_classes(self) -> dict[str, str]:
        """Every RuntimeClass's name with its handler."""
        ...

    def read_daemonset_metadata(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The DaemonSet's metadata, None when it does not exist."""
        ...


# --- the adapter over the `kubernetes` client -----------------------------------------------------------


class KubernetesClientApi:
    """KubeApi over `kubernetes.client`. Responses are read as plain JSON (`_preload_content=False`),
    so what the webhook sees is exactly what the apiserver sent."""

    def __init__(self, api_client: Any, timeout: tuple[float, float] = DEFAULT_TIMEOUT) -> None:
        from kubernetes import client  # noqa: PLC0415 - start-up time, see the module docstring

        self.api_client = api_client
        self.timeout = timeout
        self.core = client.CoreV1Api(api_client)
        self.admission = client.AdmissionregistrationV1Api(api_client)
        self.resource = client.ResourceV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.node = client.NodeV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)

    @classmethod
    def from_environment(
        cls, kubeconfig: str | None = None, timeout: tuple[float, float] = DEFAULT_TIMEOUT
    ) -> KubernetesClientApi:
        """In-cluster config (the pod's ServiceAccount), or a kubeconfig file when one is given."""
        return cls(api_client(kubeconfig, in_cluster_first=True), timeout)

    def read_raw(self, method: Any, *args: Any, not_found_is_none: bool = True, served: str = "",
                 **kwargs: Any) -> bytes | None:
        """The body of one call of a `kubernetes` API method (of `core`, `admission`, `resource`, `custom`),
        as the server sent it: None for 404 (when `not_found_is_none`), a KubeError for any other failure.
        `served` (e.g. "resource.k8s.io/v1 resourceclaims"): an API that may not be served; a 404 that is not
        an object's NotFound is NotServed naming it."""
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415
        from urllib3.exceptions import HTTPError  # noqa: PLC0415

        try:
            response = method(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
            return bytes(response.data)
        except ApiException as exc:
            if exc.status == 404 and served and not object_not_found(exc.body):
                raise NotServed(404, "NotServed", f"the API server does not serve {served}") from None
            if exc.status == 404 and not_found_is_none:
                return None
            raise error_from_status(int(exc.status or 0), exc.body) from None
        except (HTTPError, OSError) as exc:
            raise ApiUnavailable(0, "Unreachable", f"{type(exc).__name__}: {exc}") from None

    def _call(self, method: Any, *args: Any, not_found_is_none: bool = True, served: str = "", **kwargs: Any) -> Any:
        raw = self.read_raw(method, *args, not_found_is_none=not_found_is_none, served=served, **kwargs)
        return None if raw is None else json.loads(raw)

    def read_secret(self, namespace: str, name: str) -> SecretObject | None:
        body = self._call(self.core.read_namespaced_secret, name, namespace)
        return None if body is None else SecretObject.from_body(body)

    def create_secret(self, secret: SecretObject) -> SecretObject:
        body = self._call(self.core.create_namespaced_secret, secret.namespace, secret.to_body(),
                          not_found_is_none=False)
        return SecretObject.from_body(body)

    def replace_secret(self, secret: SecretObject) -> SecretObject:
        body = self._call(self.core.replace_namespaced_secret, secret.name, secret.namespace, secret.to_body(),
                          not_found_is_none=False)
        return SecretObject.from_body(body)

    def _webhook_methods(self, kind: str) -> tuple[Any, Any]:
        if kind == MUTATING:
            return (self.admission.read_mutating_webhook_configuration,
                    self.admission.patch_mutating_webhook_configuration)
        if kind == VALIDATING:
            return (self.admission.read_validating_webhook_configuration,
                    self.admission.patch_validating_webhook_configuration)
        raise ValueError(f"not a webhook configuration kind: {kind}")

    def wait_for_secret_change(self, namespace: str, name: str, seconds: float) -> bool:
        """Block until the Secret is changed, deleted or created, at most `seconds`: True if it was.
        A list by name gives the resourceVersion to watch from, so only what happens after the call counts
        (RBAC: list and watch on that one Secret, allowed by resourceNames with a metadata.name selector)."""
        from kubernetes import watch  # noqa: PLC0415

        selector = f"metadata.name={name}"
        listed = self._call(self.core.list_namespaced_secret, namespace, field_selector=selector,
                            not_found_is_none=False)
        version = listed["metadata"]["resourceVersion"]
        watcher = watch.Watch()  # type: ignore[no-untyped-call]
        try:
            for _event in watcher.stream(  # type: ignore[no-untyped-call]
                    self.core.list_namespaced_secret, namespace, field_selector=selector, resource_version=version,
                    timeout_seconds=max(1, int(seconds)), _request_timeout=(self.timeout[0], seconds + 10)):
                return True
        except Exception as exc:  # the client raises ApiException, urllib3's and OSError's errors
            raise ApiUnavailable(0, "WatchFailed", f"{type(exc).__name__}: {exc}") from None
        finally:
            watcher.stop()  # type: ignore[no-untyped-call]
        return False

    def read_webhook_configuration(self, kind: str, name: str) -> WebhookConfiguration | None:
        read, _ = self._webhook_methods(kind)
        body = self._call(read, name)
        return None if body is None else WebhookConfiguration.from_body(kind, body)

    def patch_ca_bundle(
        self, kind: str, name: str, webhook_names: Sequence[str], ca_bundle: bytes
    ) -> WebhookConfiguration:
        _, patch = self._webhook_methods(kind)
        body = self._call(patch, name, ca_bundle_patch(webhook_names, ca_bundle), not_found_is_none=False,
                          _content_type="application/strategic-merge-patch+json")
        return WebhookConfiguration.from_body(kind, body)

    def read_namespace(self, name: str) -> Mapping[str, str] | None:
        body = self._call(self.core.read_namespace, name)
        return None if body is None else dict((body.get("metadata") or {}).get("labels") or {})

    def read_node(self, name: str) -> Mapping[str, str] | None:
        body = self._call(self.core.read_node, name)
        return None if body is None else dict((body.get("metadata") or {}).get("labels") or {})

    def read_resource_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        body = self._call(self.resource.read_namespaced_resource_claim, name, namespace,
                          served="resource.k8s.io/v1 resourceclaims")
        return body if isinstance(body, dict) else None

    def read_resource_claim_template(self, namespace: str, name: str) -> dict[str, Any] | None:
        body = self._call(self.resource.read_namespaced_resource_claim_template, name, namespace,
                          served="resource.k8s.io/v1 resourceclaimtemplates")
        return body if isinstance(body, dict) else None

    def read_configmap(self, namespace: str, name: str) -> frozenset[str] | None:
        body = self._call(self.core.read_namespaced_config_map, name, namespace)
        if body is None:
            return None
        return frozenset(body.get("data") or {}) | frozenset(body.get("binaryData") or {})

    def read_configmap_data(self, namespace: str, name: str) -> dict[str, str] | None:
        body = self._call(self.core.read_namespaced_config_map, name, namespace)
        return None if body is None else {str(k): str(v) for k, v in (body.get("data") or {}).items()}

    def read_cluster_policy(self, name: str) -> dict[str, Any] | None:
        body = self._call(self.custom.get_cluster_custom_object, "nvidia.com", "v1", "clusterpolicies", name,
                          served="nvidia.com/v1 clusterpolicies (the GPU Operator's CRDs are not installed)")
        return body if isinstance(body, dict) else None

    def read_runtime_class(self, name: str) -> str | None:
        body = self._call(self.node.read_runtime_class, name)
        return None if body is None else str(body.get("handler") or "")

    def list_runtime_classes(self) -> dict[str, str]:
        body = self._call(self.node.list_runtime_class, not_found_is_none=False)
        return {str(item["metadata"]["name"]): str(item.get("handler") or "") for item in body.get("items") or ()}

    def read_daemonset_metadata(self, namespace: str, name: str) -> dict[str, Any] | None:
        body = self._call(self.apps.read_namespaced_daemon_set, name, namespace)
        return None if body is None else dict(body.get("metadata") or {})
