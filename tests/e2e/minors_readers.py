"""The webhook's live readers on each minor (tests/e2e/test_kubernetes_minors.py): the webhook as the chart runs it
(its Deployment's flags, its ServiceAccount's token), logging at debug, so that urllib3 writes one line per request
it sends to the API server: what it asked, and how often, is read from its own log."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gpu_stack_dev.e2e.e2elib import E2ECluster, LiveWebhook, Release
from gpu_stack_webhook.server.decision_log import DECISION_LOGGER

from .test_tls_selfmanaged import sa_kubeconfig

DENIED = '"validate.gpu-stack.io" denied the request: '
# The chart Deployment's flags that choose what the webhook reads from the cluster.
SOURCE_FLAGS = ("--cluster-lookups", "--policy-source", "--cluster-policy", "--operator-namespace",
                "--operator-service-account", "--runtime-classes")
NO_CLUSTER_POLICY = ("GPU010 the GPU configuration this policy follows cannot be read: clusterpolicies.nvidia.com "
                     "cluster-policy cannot be read: the API server does not serve nvidia.com/v1 clusterpolicies (the "
                     "GPU Operator's CRDs are not installed) (spec)")
# urllib3.connectionpool at DEBUG: https://127.0.0.1:PORT "GET /apis/... HTTP/1.1" 404 19
REQUEST = re.compile(r'"([A-Z]+) (/[^ "]*) HTTP/1\.1" (\d{3})')


def chart_flags(cluster: E2ECluster, release: Release) -> list[str]:
    deployment = cluster.get_json("deployment", f"{release.fullname}-webhook", "-n", release.namespace)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    flags: list[str] = []
    for index, arg in enumerate(args):
        if arg in SOURCE_FLAGS:
            flags += [arg] if arg == "--cluster-lookups" else [arg, args[index + 1]]
    return flags


def start_as_the_chart_runs_it(cluster: E2ECluster, release: Release, workdir: Path, probe_namespace: str,
                               interval: str = "1s") -> LiveWebhook:
    hook = LiveWebhook(cluster, workdir)
    kubeconfig = sa_kubeconfig(cluster, release, workdir.with_name(workdir.name + ".kubeconfig"))
    hook.start(release, extra_args=[*chart_flags(cluster, release), "--kubeconfig", str(kubeconfig),
                                    "--policy-source-interval", interval, "--log-level", "debug"],
               probe_namespace=probe_namespace)
    return hook


@dataclass(frozen=True)
class Line:
    level: str
    logger: str
    message: str
    fields: dict[str, Any]


def log_lines(log: str) -> list[Line]:
    out = []
    for text in log.splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if isinstance(line, dict):
            out.append(Line(str(line.get("level")), str(line.get("logger")), str(line.get("message")), line))
    return out


def not_found_lines(log: str) -> list[str]:
    """The lines of the webhook's log that name an HTTP 404 (an API this minor does not serve), but the decision
    lines, whose uids and durations are request data ("duration_ms":0.404), and each line's clock ("...,404")."""
    found = []
    for raw in log.splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            line = None
        text = raw
        if isinstance(line, dict):
            if line.get("logger") == DECISION_LOGGER:
                continue
            text = json.dumps({key: value for key, value in line.items() if key != "time"})
        if re.search(r"\b404\b", text):
            found.append(raw)
    return found


def api_requests(log: str, prefix: str) -> list[tuple[str, str, int]]:
    """(method, path, status) of every request the webhook sent to a path starting with `prefix`."""
    return [(m.group(1), m.group(2), int(m.group(3))) for line in log_lines(log) if line.logger.startswith("urllib3")
            for m in REQUEST.finditer(line.message) if m.group(2).startswith(prefix)]


def request_times(log: str, path: str) -> list[float]:
    """When (seconds, the webhook's own log clock) each request to exactly `path` was answered."""
    return [datetime.strptime(str(line.fields["time"]), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            for line in log_lines(log) if line.logger.startswith("urllib3")
            for m in REQUEST.finditer(line.message) if m.group(2) == path]


def ours(log: str, level: str) -> list[str]:
    """The webhook's own log lines at `level` (not gunicorn's, not urllib3's)."""
    return [line.message for line in log_lines(log) if line.level == level and line.logger.startswith("gpu_stack")]


def verdict(cluster: E2ECluster, namespace: str, pod: dict[str, Any]) -> tuple[str, str]:
    """("allowed" | "denied: GPU0xx, ..." | the API server's own refusal, what kubectl printed on stderr)."""
    proc = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(pod),
                           check=False)
    if proc.returncode == 0:
        return "allowed", proc.stderr.strip()
    if DENIED in proc.stderr:
        found = sorted(set(re.findall(r"\bGPU0\d\d\b", proc.stderr.split(DENIED, 1)[1])))
        return "denied: " + ", ".join(found), proc.stderr.strip()
    return proc.stderr.strip(), proc.stderr.strip()


def pod(name: str, *, claim: str | None = None, privileged: bool = False, runtime_class: str | None = None,
        gpus: int = 0) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    spec: dict[str, Any] = {"containers": [container]}
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    if privileged:
        container["securityContext"] = {"privileged": True}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def workload(nvidia_runtime_class: str) -> dict[str, dict[str, Any]]:
    """Pods that make each reader read: claims (ResourceClaims, that do not exist), a RuntimeClass that the webhook
    knows as the NVIDIA runtime only from the live RuntimeClasses (its handler), and plain pods beside them."""
    return {"claim": pod("claim", claim="one-gpu"),
            "claim-privileged": pod("claim-privileged", claim="other-gpu", privileged=True),
            "nvidia-runtime-privileged": pod("nvidia-runtime-privileged", runtime_class=nvidia_runtime_class,
                                             privileged=True),
            "privileged": pod("privileged", privileged=True),
            "plain": pod("plain")}


def expected_verdicts(dra_served: bool) -> dict[str, str]:
    """Where resource.k8s.io is not served (1.32's default: DRA off) the API server drops the pod's claims before
    the webhook judges it: a privileged container there holds no GPU. Elsewhere the claims cannot be read (they
    do not exist), and a privileged container beside one is refused (policy dra.unresolvedClaims: deny)."""
    return {"claim": "allowed", "claim-privileged": "denied: GPU003" if dra_served else "allowed",
            "nvidia-runtime-privileged": "denied: GPU003", "privileged": "allowed", "plain": "allowed"}
