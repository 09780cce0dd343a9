"""The API server stops answering the webhook's list of RuntimeClasses (its RBAC revoked, on the real API
server): the webhook keeps its last good read for --policy-source-keep, so the cluster's sandboxed pods are
still admitted, then fails closed for pods naming a runtime class (GPU010) only, exports how old its last
read is, and follows again once the RBAC is back (kube/live.py LastGood; tests/webhook/test_live_outage.py has
both sides with a stub API and a fake clock).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import ssl
import time
from pathlib import Path
from typing import Any

from gpu_stack_dev.e2e.e2elib import E2ECluster, LiveWebhook, Releases, unique

from .test_tls_selfmanaged import sa_kubeconfig

KEEP_SECONDS = 20
WAIT_SECONDS = 90
METRIC = re.compile(r'^gpu_stack_policy_source_last_read_timestamp_seconds\{[^}]*source="runtime-classes"[^}]*\} '
                    r'(\S+)$', re.MULTILINE)


def verdict(cluster: E2ECluster, namespace: str, manifest: dict[str, Any]) -> tuple[bool, str]:
    proc = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(manifest),
                           check=False)
    return proc.returncode == 0, proc.stderr.strip()


def pod(name: str, runtime_class: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def last_read(hook: LiveWebhook) -> float:
    assert hook.pki is not None
    context = ssl.create_default_context(cafile=str(hook.pki.ca_cert))
    conn = http.client.HTTPSConnection("127.0.0.1", hook.port, context=context, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    match = METRIC.search(text)
    assert match, text
    return float(match.group(1))


def until(check: Any, what: str, hook: LiveWebhook) -> Any:
    deadline = time.monotonic() + WAIT_SECONDS
    while not (result := check()):
        assert time.monotonic() < deadline, f"{what}\n{hook.log()[-4000:]}"
        time.sleep(0.5)
    return result


def runtime_class_binding(cluster: E2ECluster, selector: str) -> dict[str, Any]:
    """The release's ClusterRoleBinding that lets the webhook list RuntimeClasses."""
    for binding in cluster.get_json("clusterrolebinding", "-l", selector)["items"]:
        role = cluster.get_json("clusterrole", binding["roleRef"]["name"])
        if any("runtimeclasses" in rule.get("resources", []) for rule in role.get("rules") or []):
            return dict(binding)
    raise AssertionError(f"no ClusterRoleBinding of {selector} grants runtimeclasses")


def test_revoked_runtime_class_list_keeps_the_last_read_then_fails_closed(
        cluster: E2ECluster, releases: Releases, live_webhook: Any, tmp_path: Path) -> None:
    release, _ = releases.install(set_json={"webhook.lookups.enabled": True})
    sandboxed = unique("sandboxed")
    cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": sandboxed}, "handler": "runsc"}))
    binding = runtime_class_binding(cluster, release.selector)
    restored = False
    try:
        namespace = cluster.create_namespace()
        kubeconfig = sa_kubeconfig(cluster, release, tmp_path / "sa.kubeconfig")
        hook = live_webhook(release, extra_args=[
            "--kubeconfig", str(kubeconfig), "--runtime-classes", "live", "--policy-source-interval", "1s",
            "--policy-source-keep", f"{KEEP_SECONDS}s"], probe_namespace=namespace)
        assert verdict(cluster, namespace, pod("sandboxed", sandboxed)) == (True, "")

        cluster.kubectl("delete", "clusterrolebinding", binding["metadata"]["name"])
        until(lambda: "policy-source-read-kept" in hook.log(), "the webhook never saw its list refused", hook)
        # Within the kept time: judged by the last good read, the sandboxed pod is admitted.
        assert verdict(cluster, namespace, pod("sandboxed", sandboxed)) == (True, "")

        def refused() -> str:
            allowed, message = verdict(cluster, namespace, pod("sandboxed", sandboxed))
            return "" if allowed else message

        message = until(refused, "never failed closed", hook)
        assert "GPU010" in message and "no permission to list runtimeclasses.node.k8s.io" in message, message
        assert verdict(cluster, namespace, pod("plain", None)) == (True, "")  # no runtime class: judged as before
        assert time.time() - last_read(hook) > KEEP_SECONDS  # the metric the alert reads shows it

        recreated = {k: binding[k] for k in ("apiVersion", "kind", "roleRef", "subjects")}
        recreated["metadata"] = {"name": binding["metadata"]["name"], "labels": binding["metadata"].get("labels", {}),
                                 "annotations": binding["metadata"].get("annotations", {})}
        cluster.kubectl("create", "-f", "-", input=json.dumps(recreated))
        restored = True
        until(lambda: verdict(cluster, namespace, pod("sandboxed", sandboxed))[0], "never read again", hook)
        assert time.time() - last_read(hook) < WAIT_SECONDS
    finally:
        if not restored:
            with contextlib.suppress(Exception):
                recreated = {k: binding[k] for k in ("apiVersion", "kind", "roleRef", "subjects")}
                recreated["metadata"] = {"name": binding["metadata"]["name"]}
                cluster.kubectl("create", "-f", "-", input=json.dumps(recreated), check=False)
        cluster.kubectl("delete", "runtimeclass", sandboxed, "--ignore-not-found", check=False)
