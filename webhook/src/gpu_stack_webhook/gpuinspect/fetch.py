"""Where `gpu-stack-webhook inspect` gets its data: Nodes, Pods and the chart's device plugin ConfigMap,
read with the user's kubeconfig through the `kubernetes` client.

- Lists are paged (`limit` + `continue`, `chunk_size` objects per request, like kubectl's 500) and read
  as raw JSON (orjson) rather than through the client's model classes, which are many times slower.
- Pods are filtered by the API server: bound and not finished
  (`spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed`), and `spec.nodeName=NODE` for `--node`.
- The ConfigMap is read with one `get` (the chart's ClusterRole may name it in resourceNames); when it
  is missing or forbidden the report still shows what the node labels say, with a note.
- DRA (resource.k8s.io/v1): ResourceSlices of the NVIDIA DRA driver (field selector spec.driver, and
  spec.nodeName for one --node) and ResourceClaims in every namespace, paged. An API server that does not
  serve resource.k8s.io/v1 (before Kubernetes 1.34, or DRA switched off): no DRA devices, and a note saying so;
  a forbidden read leaves a note.
- The chart's Grafana dashboards: its labelled ConfigMaps and grafana-operator GrafanaDashboards in the
  dashboards namespace (a list each, label-selected; the chart's namespaced Role grants it). Forbidden
  reads leave a note, a GrafanaDashboard API the cluster does not serve is no dashboards.
- Every failure is an `InspectError` whose message says what to do: no kubeconfig, no answer from the
  server, credentials refused, or the verb and resource that RBAC refused.

Every request goes through the one Kubernetes adapter (kube/client.py `KubernetesClientApi.read_raw`: its
request timeout, its errors), over the client kube/connect.py's `api_client` builds, as for `serve`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import orjson

from gpu_stack_webhook.kube.client import ApiUnavailable, KubeError, KubernetesClientApi, NotServed
from gpu_stack_webhook.kube.connect import ClientConfigError
from gpu_stack_webhook.kube.connect import api_client as new_api_client

DEFAULT_CHUNK_SIZE = 500
DEFAULT_TIMEOUT = (5.0, 60.0)  # (connect, read) seconds per request
UNFINISHED = "status.phase!=Succeeded,status.phase!=Failed"
POD_FIELD_SELECTOR = f"spec.nodeName!=,{UNFINISHED}"
DEFAULT_CONFIG_ANNOTATION = "gpu-stack.io/default-config"
RBAC_HINT = "the chart's read-only ClusterRole and Role (inspect.rbac.create) grant what inspect needs"
# The chart's dashboard ConfigMaps and GrafanaDashboards (templates/monitoring/) carry its common labels.
DASHBOARD_SELECTOR = "app.kubernetes.io/part-of=gpu-stack,app.kubernetes.io/component=monitoring"
GRAFANA_DASHBOARDS = ("grafana.integreatly.org", "v1beta1", "grafanadashboards")
DRA_GROUP, DRA_VERSION = "resource.k8s.io", "v1"
DRA_DRIVER = "gpu.nvidia.com"  # dra.DRA_DRIVERS


class InspectError(Exception):
    """A failure the user can act on; the message is printed as it is."""


@dataclass
class Snapshot:
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    configs: Mapping[str, str] | None  # ConfigMap data, None when unavailable
    default_config: str | None
    notes: list[str] = field(default_factory=list)
    # The chart's dashboard ConfigMaps and GrafanaDashboards; None when they could not be listed.
    dashboards: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None
    resource_slices: list[dict[str, Any]] = field(default_factory=list)
    resource_claims: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0
    seconds: float = 0.0
    # The device plugin ConfigMap's annotations (the idle thresholds, usage_query.py IDLE_ANNOTATIONS)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Query:
    nodes: Sequence[str] = ()  # --node (exact names)
    node_selector: str | None = None  # -l
    namespace: str | None = None  # --namespace: only the holders listed, not the counts
    configmap_namespace: str = "gpu-stack"
    configmap_name: str = "gpu-stack-device-plugin-configs"
    dashboards_namespace: str | None = None  # None: configmap_namespace
    chunk_size: int = DEFAULT_CHUNK_SIZE
    # Read the chart's device plugin ConfigMap (not with --policy-source: the configs are another project's)
    chart_configmap: bool = True

    @property
    def dashboards_in(self) -> str:
        return self.dashboards_namespace or self.configmap_namespace


def api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A client for the user's kubeconfig ($KUBECONFIG, ~/.kube/config), else the in-cluster account."""
    try:
        return new_api_client(kubeconfig, context)
    except ClientConfigError as exc:
        raise InspectError(str(exc)) from None


class Reader:
    """Counts its requests; every call goes through `_raw`, and so through the adapter."""

    def __init__(self, api: Any, timeout: tuple[float, float] = DEFAULT_TIMEOUT) -> None:
        self.api = KubernetesClientApi(api, timeout)
        self.core = self.api.core
        self.custom = self.api.custom
        self.host = str(api.configuration.host)
        self.requests = 0

    def _get(self, method: Callable[..., Any], verb: str, resource: str, scope: str, *args: Any,
             **kwargs: Any) -> dict[str, Any] | None:
        raw = self._raw(method, verb, resource, scope, *args, **kwargs)
        return None if raw is None else dict(orjson.loads(raw))

    def _raw(self, method: Callable[..., Any], verb: str, resource: str, scope: str, *args: Any,
             served: str = "", **kwargs: Any) -> bytes | None:
        """The response body as sent; None for 404; an InspectError for anything else that is not 2xx.
        `served`: an API the server may not serve (NotServed, kube/client.py, when it does not)."""
        self.requests += 1
        try:
            return self.api.read_raw(method, *args, served=served, **kwargs)
        except NotServed:
            raise
        except KubeError as exc:
            if isinstance(exc, ApiUnavailable) and exc.status == 0:
                raise InspectError(f"cannot reach the Kubernetes API server at {self.host}: {exc.message}") from None
            raise _refused(exc, self.host, verb, resource, scope) from None

    def list_all(self, method: Callable[..., Any], resource: str, scope: str, *args: Any, chunk_size: int,
                 served: str | None = None, **selectors: str | None) -> Iterator[dict[str, Any]]:
        """Every item, page by page. The next page is requested as soon as this one's continue token is
        read from the top of its body, so the server prepares it while this one is parsed."""
        kwargs = {k: v for k, v in selectors.items() if v}

        def fetch(token: str | None) -> bytes | None:
            return self._raw(method, "list", resource, scope, *args, limit=chunk_size, served=served or "",
                             **({"_continue": token} if token else {}), **kwargs)

        with ThreadPoolExecutor(1, thread_name_prefix="inspect-prefetch") as prefetch:
            raw = fetch(None)
            while raw is not None:  # None: a namespace that does not exist
                guessed = _continue_token(raw)
                ahead = prefetch.submit(fetch, guessed) if guessed else None
                page = orjson.loads(raw)
                yield from page.get("items") or []
                token = (page.get("metadata") or {}).get("continue")
                if not token:
                    return
                # A quick read that missed or was wrong (never seen from a real server): ask again properly.
                raw = ahead.result() if ahead is not None and guessed == token else fetch(token)

    def nodes(self, query: Query) -> list[dict[str, Any]]:
        if len(query.nodes) == 1:
            selectors = {"field_selector": f"metadata.name={query.nodes[0]}", "label_selector": query.node_selector}
        else:
            selectors = {"label_selector": query.node_selector}
        found = list(self.list_all(self.core.list_node, "nodes", "at the cluster scope",
                                   chunk_size=query.chunk_size, **selectors))
        if query.nodes:
            found = [n for n in found if n.get("metadata", {}).get("name") in query.nodes]
            missing = sorted(set(query.nodes) - {n["metadata"]["name"] for n in found})
            if missing and not query.node_selector:
                raise InspectError(f"node{'s' if len(missing) > 1 else ''} not found: {', '.join(missing)}")
        return found

    def pods(self, query: Query, node_names: Sequence[str]) -> list[dict[str, Any]]:
        """Bound, unfinished pods in every namespace: their requests count whatever --namespace says."""
        if query.nodes:
            return [pod for node in node_names for pod in self.list_all(
                self.core.list_pod_for_all_namespaces, "pods", "at the cluster scope",
                chunk_size=query.chunk_size, field_selector=f"spec.nodeName={node},{UNFINISHED}")]
        return list(self.list_all(self.core.list_pod_for_all_namespaces, "pods", "at the cluster scope",
                                  chunk_size=query.chunk_size, field_selector=POD_FIELD_SELECTOR))

    def configmap(self, query: Query) -> tuple[Mapping[str, str] | None, str | None, list[str],
                                               Mapping[str, str]]:
        where = f"{query.configmap_namespace}/{query.configmap_name}"
        try:
            body = self._get(self.core.read_namespaced_config_map, "get", "configmaps",
                             f"in namespace {query.configmap_namespace}", query.configmap_name,
                             query.configmap_namespace)
        except InspectError as exc:
            if not str(exc).startswith("forbidden"):
                raise
            return None, None, [f"device plugin configs not read ({exc}); sharing is shown as GFD labels it"], {}
        if body is None:
            return None, None, [f"ConfigMap {where} not found (--configmap-namespace/--configmap name it); "
                                "sharing is shown as GFD labels it"], {}
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        return (dict(body.get("data") or {}), annotations.get(DEFAULT_CONFIG_ANNOTATION), [],
                {str(k): str(v) for k, v in annotations.items()})


    def dra(self, query: Query) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
        """(ResourceSlices of the NVIDIA DRA driver, ResourceClaims of every namespace, notes)."""
        selector = f"spec.driver={DRA_DRIVER}"
        if len(query.nodes) == 1:
            selector += f",spec.nodeName={query.nodes[0]}"
        try:
            slices = list(self.list_all(self.custom.list_cluster_custom_object, f"resourceslices.{DRA_GROUP}",
                                        "at the cluster scope", DRA_GROUP, DRA_VERSION, "resourceslices",
                                        chunk_size=query.chunk_size, field_selector=selector,
                                        served=f"{DRA_GROUP}/{DRA_VERSION} resourceslices"))
            claims = list(self.list_all(self.custom.list_cluster_custom_object, f"resourceclaims.{DRA_GROUP}",
                                        "at the cluster scope", DRA_GROUP, DRA_VERSION, "resourceclaims",
                                        chunk_size=query.chunk_size)) if slices else []
        except NotServed as exc:
            return [], [], [f"DRA devices not read: {exc.message} (Kubernetes before 1.34, or DRA switched off)"]
        except InspectError as exc:
            if not str(exc).startswith("forbidden"):
                raise
            return [], [], [f"DRA devices not read ({exc})"]
        return slices, claims, []

    def dashboards(self, query: Query) -> tuple[tuple[list[dict[str, Any]], list[dict[str, Any]]] | None, list[str]]:
        """(dashboard ConfigMaps, GrafanaDashboards) of the chart in the dashboards namespace, and notes."""
        namespace = query.dashboards_in
        scope = f"in namespace {namespace}"
        try:
            configmaps = list(self.list_all(self.core.list_namespaced_config_map, "configmaps", scope, namespace,
                                            chunk_size=query.chunk_size, label_selector=DASHBOARD_SELECTOR))
        except InspectError as exc:
            if not str(exc).startswith("forbidden"):
                raise
            return None, [f"dashboards not looked up ({exc})"]
        notes = []
        group, version, plural = GRAFANA_DASHBOARDS
        try:  # a cluster without grafana-operator answers 404: none
            operator = list(self.list_all(self.custom.list_namespaced_custom_object, f"{plural}.{group}", scope,
                                          group, version, namespace, plural, chunk_size=query.chunk_size,
                                          label_selector=DASHBOARD_SELECTOR))
        except InspectError as exc:
            if not str(exc).startswith("forbidden"):
                raise
            operator, notes = [], [f"GrafanaDashboards not looked up ({exc})"]
        return (configmaps, operator), notes


_CONTINUE = re.compile(rb'"continue":("[^"\\]*")')


def _continue_token(raw: bytes) -> str | None:
    """metadata.continue of a list body, read before parsing it: the API server writes ListMeta before
    items. Checked against the parsed page before it is relied on."""
    head = raw[:raw.find(b'"items":')] if b'"items":' in raw[:4096] else raw[:4096]
    found = _CONTINUE.search(head)
    return str(orjson.loads(found.group(1))) if found else None


def _refused(exc: KubeError, host: str, verb: str, resource: str, scope: str) -> InspectError:
    """What the user is told when the API server answered a request with an error status."""
    status, message = exc.status, exc.message or "no details"
    if status == 401:
        return InspectError(f"the API server at {host} refused the credentials (401 Unauthorized): {message}")
    if status == 403:
        return InspectError(f"forbidden: you cannot {verb} {resource} {scope} ({message}); {RBAC_HINT}")
    if status == 410:
        return InspectError(f"{verb} {resource}: the list changed too much while paging ({message}); "
                            "run the command again")
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = exc.reason
    return InspectError(f"{verb} {resource} {scope}: HTTP {status} {reason}: {message}")


def fetch(api: Any, query: Query, configmap_read: Callable[[Mapping[str, str]], None] | None = None) -> Snapshot:
    """`configmap_read(annotations)` is called once the device plugin ConfigMap is read, first, before the
    nodes and pods (inspect --usage starts asking Prometheus then)."""
    started = time.perf_counter()
    reader = Reader(api)
    configs, default, notes, annotations = reader.configmap(query) if query.chart_configmap else (None, None, [], {})
    if configmap_read is not None:
        configmap_read(annotations)
    nodes = reader.nodes(query)
    pods = reader.pods(query, [n["metadata"]["name"] for n in nodes]) if nodes else []
    slices, claims, dra_notes = reader.dra(query) if nodes else ([], [], [])
    dashboards, dashboard_notes = reader.dashboards(query)
    return Snapshot(nodes=nodes, pods=pods, configs=configs, default_config=default,
                    notes=notes + dra_notes + dashboard_notes, dashboards=dashboards, resource_slices=slices,
                    resource_claims=claims, requests=reader.requests, seconds=time.perf_counter() - started,
                    annotations=annotations)
