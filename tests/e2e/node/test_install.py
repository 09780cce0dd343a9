"""The chart's pods running on a real node, as a user meets them after `helm install --wait`: the webhook
pods Ready with the chart's securityContext, TLS made by the pods themselves, kubectl's answers coming from
the pods through the chart's Service (the webhook configurations are never re-pointed here), `helm test`,
the decision log and /metrics of a pod."""

from __future__ import annotations

import base64
import json
import re
import socket
import ssl
import subprocess
import time

import yaml
from gpu_stack_dev.e2e.e2elib import ROOT, WEBHOOK_KINDS, E2ECluster, Release, unique
from gpu_stack_dev.e2e.node_install import TEST_NAMESPACE, webhook_pods

DEMO_MANIFESTS = ROOT / "hack" / "demo" / "manifests"


def pod_log(cluster: E2ECluster, release: Release, pod: dict) -> str:
    return cluster.kubectl("logs", "-n", release.namespace, pod["metadata"]["name"]).stdout


def test_the_webhook_pods_are_ready_and_no_worker_crash_loops(cluster: E2ECluster, installed: Release) -> None:
    pods = webhook_pods(cluster, installed)
    assert len(pods) == 2
    for pod in pods:
        ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"]
        assert ready == "True", pod["metadata"]["name"]
        assert [s["restartCount"] for s in pod["status"]["containerStatuses"]] == [0]
        context = pod["spec"]["securityContext"]
        assert (context["runAsUser"], context["runAsNonRoot"]) == (65532, True)
        assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
        log = pod_log(cluster, installed, pod)
        # gVisor refuses a second SO_REUSEPORT bind: the workers share one socket instead of crash-looping
        assert "Connection in use" not in log
        assert log.count("SO_REUSEPORT: a second bind of one port is refused here") == 1, log
        assert log.count("Booting worker with pid") == 2, log


def test_the_tls_secret_and_both_ca_bundles_come_from_the_pods(cluster: E2ECluster, installed: Release) -> None:
    manifest = cluster.helm("get", "manifest", installed.name, "-n", installed.namespace).stdout
    rendered_secrets = [d["metadata"]["name"] for d in yaml.safe_load_all(manifest) if d and d["kind"] == "Secret"]
    secret_name = f"{installed.fullname}-webhook-tls"
    assert secret_name not in rendered_secrets  # made at run time, not by helm
    secret = cluster.get_json("secret", secret_name, "-n", installed.namespace)
    ca = base64.b64decode(secret["data"]["ca.crt"])
    for kind in WEBHOOK_KINDS:
        for config in cluster.get_json(kind, "-l", installed.selector)["items"]:
            for hook in config["webhooks"]:
                assert "url" not in hook["clientConfig"], "re-pointed: the API server must call the Service"
                assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca, hook["name"]
    # The Service (kube-proxy's rules) answers with a certificate that this CA signed for its DNS name.
    service = cluster.get_json("service", f"{installed.fullname}-webhook", "-n", installed.namespace)
    context = ssl.create_default_context(cadata=ca.decode())
    host = f"{installed.fullname}-webhook.{installed.namespace}.svc"
    with socket.create_connection((service["spec"]["clusterIP"], 443), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        assert tls.version() in ("TLSv1.2", "TLSv1.3")


def console_examples() -> list[tuple[str, int, str, list[str]]]:
    """(doc file, line, manifest, expected output lines) of every `$ kubectl apply -f <demo manifest>` in a
    console block of README.md and docs/."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        lines = doc.read_text().splitlines()
        in_console = False
        for number, line in enumerate(lines, 1):
            if line.startswith("```"):
                in_console = line.strip() == "```console" and not in_console
                continue
            match = re.fullmatch(r"\$ kubectl apply -f (\S+\.yaml)", line)
            if in_console and match and (DEMO_MANIFESTS / match.group(1)).is_file():
                expected = []
                for following in lines[number:]:
                    if not following.strip() or following.startswith(("$", "```")):
                        break
                    expected.append(following)
                found.append((str(doc.relative_to(ROOT)), number, match.group(1), expected))
    return found


def test_the_docs_kubectl_examples_come_back_from_the_pods(cluster: E2ECluster, installed: Release) -> None:
    examples = console_examples()
    assert examples, "no `$ kubectl apply -f` examples of hack/demo/manifests in README.md or docs/"
    namespace = cluster.create_namespace(unique("examples"))
    for doc, line, manifest, expected in examples:
        proc = subprocess.run([cluster.kubectl_bin, "apply", "-n", namespace, "-f", manifest], cwd=DEMO_MANIFESTS,
                              capture_output=True, text=True, env=cluster.env, timeout=60, check=False)
        got = (proc.stderr + proc.stdout).splitlines()
        assert got == expected, f"{doc}:{line}: kubectl apply -f {manifest}"


def metric_total(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def scrape(cluster: E2ECluster, release: Release, pod: dict) -> str:
    """GET /metrics of one pod, through the API server's pod proxy (what Prometheus' pod discovery reaches)."""
    return cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{release.namespace}/pods/"
                                           f"https:{pod['metadata']['name']}:8443/proxy/metrics").stdout


def reviews_total(cluster: E2ECluster, release: Release, pods: list[dict], decision: str, **labels: str) -> float:
    """validate reviews with `decision` (and the metric's other `labels`, such as kind) over the pods, once it holds
    still: each worker flushes its increments to the multiprocess files once a second, so a scrape right after a
    review may not count it yet."""
    def total() -> float:
        return sum(metric_total(scrape(cluster, release, p), "gpu_stack_admission_reviews_total",
                                endpoint="validate", decision=decision, **labels) for p in pods)
    last = total()
    while True:
        time.sleep(1.5)
        now = total()
        if now == last:
            return now
        last = now


def test_decisions_are_logged_as_json_and_counted_in_metrics(cluster: E2ECluster, installed: Release) -> None:
    pods = webhook_pods(cluster, installed)
    before = reviews_total(cluster, installed, pods, "denied")
    name = unique("logged")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": 1}},
                                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}
    proc = cluster.kubectl("create", "--dry-run=server", "-n", TEST_NAMESPACE, "-f", "-", input=json.dumps(pod),
                           check=False)
    assert 'admission webhook "validate.gpu-stack.io" denied the request: GPU002' in proc.stderr
    lines = [json.loads(line) for p in pods for line in pod_log(cluster, installed, p).splitlines()
             if line.startswith("{") and name in line]
    assert [(d["endpoint"], d["decision"], d["denied_by"], d["dryRun"], d["namespace"]) for d in lines
            if d["endpoint"] == "validate"] == [("validate", "denied", ["GPU002"], True, TEST_NAMESPACE)]
    assert reviews_total(cluster, installed, pods, "denied") == before + 1


def test_helm_test_passes_with_its_pods_running(cluster: E2ECluster, installed: Release) -> None:
    proc = cluster.helm("test", installed.name, "-n", installed.namespace, "--logs", "--timeout", "3m", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS: validate.gpu-stack.io denied the pod" in proc.stdout
    phases = cluster.kubectl("get", "pods", "-n", installed.namespace, "-l", "app.kubernetes.io/component=test",
                             "-o", "jsonpath={range .items[*]}{.metadata.name}={.status.phase} {end}").stdout.split()
    assert phases and all(p.endswith("=Succeeded") for p in phases), phases


def webhook_pod(cluster: E2ECluster, release: Release) -> str:
    return cluster.kubectl("get", "pods", "-n", release.namespace, "-l",
                           f"{release.selector},app.kubernetes.io/component=webhook",
                           "-o", "jsonpath={.items[0].metadata.name}").stdout


def test_the_node_runs_it_as_the_chart_says(cluster: E2ECluster, installed: Release) -> None:
    """Inside a running webhook pod: uid/gid 65532. (That the root filesystem is read-only cannot be seen from
    inside here: gVisor reports no ST_RDONLY in statvfs and answers a write with EACCES before EROFS.)"""
    pod = webhook_pod(cluster, installed)
    probe = "import os\nprint(os.getuid(), os.getgid())"
    out = cluster.kubectl("exec", "-n", installed.namespace, pod, "--", "python", "-c", probe).stdout.split()
    assert out == ["65532", "65532"]
