"""Putting the inspect test cluster into a real API server: Nodes with GFD labels and device plugin
capacity (status subresource), Pods bound with spec.nodeName, the chart's device plugin ConfigMap, and a
ServiceAccount token for RBAC checks. Plain kubernetes-client calls with dict bodies."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

BIN = Path(sys.executable).parent


def api_client(kubeconfig: str | os.PathLike[str], pool: int = 16) -> client.ApiClient:
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = pool
    return client.ApiClient(configuration)


def _ignore_exists(call: Any, *args: Any, **kwargs: Any) -> None:
    try:
        call(*args, **kwargs)
    except ApiException as exc:
        if exc.status != 409:
            raise


def ensure_namespaces(api: client.ApiClient, names: Iterable[str]) -> None:
    """Namespaces and their `default` ServiceAccount (pod admission needs it; no controller may be
    running to create it)."""
    core = client.CoreV1Api(api)
    for name in sorted(set(names)):
        _ignore_exists(core.create_namespace, {"metadata": {"name": name}})
        _ignore_exists(core.create_namespaced_service_account, name, {"metadata": {"name": "default"}})


def create_node(api: client.ApiClient, node: Mapping[str, Any], extra_labels: Mapping[str, str]) -> None:
    core = client.CoreV1Api(api)
    body = copy.deepcopy(dict(node))
    body["metadata"]["labels"].update(extra_labels)
    status = body.pop("status")
    core.create_node(body)
    # What the kubelet reports from the device plugin: capacity and allocatable, via the status subresource.
    core.patch_node_status(body["metadata"]["name"], {"status": status})


def create_pod(api: client.ApiClient, pod: Mapping[str, Any]) -> None:
    core = client.CoreV1Api(api)
    body = copy.deepcopy(dict(pod))
    phase = (body.pop("status", None) or {}).get("phase")
    meta = body["metadata"]
    core.create_namespaced_pod(meta["namespace"], body)
    if phase in ("Succeeded", "Failed"):  # finished pods: only a kubelet would set this, we do it by hand
        core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": {"phase": phase}})


def create_all(api: client.ApiClient, nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
               extra_labels: Mapping[str, str], workers: int = 16) -> None:
    """Concurrent POSTs (the API server handles them in parallel; one at a time is round-trip bound)."""
    pods = list(pods)
    ensure_namespaces(api, (p["metadata"]["namespace"] for p in pods))
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda n: create_node(api, n, extra_labels), nodes))
        list(pool.map(lambda p: create_pod(api, p), pods))


def apply_configmap(api: client.ApiClient, configmap: Mapping[str, Any]) -> None:
    core = client.CoreV1Api(api)
    namespace = configmap["metadata"]["namespace"]
    ensure_namespaces(api, [namespace])
    body = {k: configmap[k] for k in ("apiVersion", "kind", "metadata", "data")}
    _ignore_exists(core.create_namespaced_config_map, namespace, body)


def service_account_kubeconfig(api: client.ApiClient, admin_kubeconfig: Path, namespace: str, name: str,
                               out: Path) -> Path:
    """A kubeconfig that authenticates as a fresh ServiceAccount (TokenRequest), for RBAC tests."""
    core = client.CoreV1Api(api)
    ensure_namespaces(api, [namespace])
    _ignore_exists(core.create_namespaced_service_account, namespace, {"metadata": {"name": name}})
    token = core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    out.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [cluster], "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": name}}],
    }))
    return out


def create_objects(api: client.ApiClient, objects: Iterable[Mapping[str, Any]]) -> None:
    """ClusterRole / ClusterRoleBinding / Role / RoleBinding dicts from a chart render (namespaces made)."""
    rbac = client.RbacAuthorizationV1Api(api)
    for obj in objects:
        if obj["kind"] == "ClusterRole":
            _ignore_exists(rbac.create_cluster_role, obj)
        elif obj["kind"] == "ClusterRoleBinding":
            _ignore_exists(rbac.create_cluster_role_binding, obj)
        elif obj["kind"] in ("Role", "RoleBinding"):
            namespace = obj["metadata"]["namespace"]
            ensure_namespaces(api, [namespace])
            create = rbac.create_namespaced_role if obj["kind"] == "Role" else rbac.create_namespaced_role_binding
            _ignore_exists(create, namespace, obj)
        else:
            raise ValueError(f"unexpected {obj['kind']}")


def delete_objects(api: client.ApiClient, objects: Iterable[Mapping[str, Any]]) -> None:
    """What create_objects made."""
    rbac = client.RbacAuthorizationV1Api(api)
    for obj in objects:
        name, namespace = obj["metadata"]["name"], obj["metadata"].get("namespace")
        delete = {"ClusterRole": rbac.delete_cluster_role, "ClusterRoleBinding": rbac.delete_cluster_role_binding,
                  "Role": rbac.delete_namespaced_role, "RoleBinding": rbac.delete_namespaced_role_binding}[obj["kind"]]
        if obj["kind"].startswith("Role"):
            delete(name, namespace)
        else:
            delete(name)


def inspect(*args: str, kubeconfig: Path, kubectl: str | None = None) -> subprocess.CompletedProcess[str]:
    """`kubectl-gpu_stack inspect ARGS`, or with `kubectl` (a binary) `kubectl gpu-stack inspect ARGS`."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "NO_COLOR": "1"}
    command = [str(BIN / "kubectl-gpu_stack"), "inspect", *args]
    if kubectl:
        command = [kubectl, "gpu-stack", "inspect", *args]
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # where kubectl finds kubectl-gpu_stack
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)
