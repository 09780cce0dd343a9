"""A real Prometheus (Debian's prometheus package, hack/ensure-promtool.sh) scrapes the live webhook and the real
API server while the suite creates pods, evaluating the chart's own alert rules: the admission metrics the
dashboards read arrive from both, and GPUStackWebhookDown fires when the webhook is stopped and resolves when it
is back. The rule file is the chart's rendered PrometheusRule with that alert's `for` cut from 5m to 5s, so the
test need not wait five minutes."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_dev.e2e.e2elib import (
    CHART,
    ROOT,
    WEBHOOK_KINDS,
    E2ECluster,
    LiveWebhook,
    Release,
    Releases,
    controlplane,
)
from gpu_stack_dev.generate.monitoring import preview

SCRAPE = "1s"
WAIT_SECONDS = 90


def prometheus_binary() -> str:
    out = subprocess.run([str(ROOT / "hack" / "ensure-promtool.sh"), "prometheus"], check=True,
                         capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def kube_credentials(cluster: E2ECluster, directory: Path) -> tuple[str, dict[str, str]]:
    """(API server address, Prometheus tls_config) from the admin kubeconfig (file paths or inline data)."""
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    server = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    files = {}
    for key, prom in (("certificate-authority", "ca_file"), ("client-certificate", "cert_file"),
                      ("client-key", "key_file")):
        source = server if key == "certificate-authority" else user
        if key in source:
            files[prom] = str(source[key])
        elif f"{key}-data" in source:
            path = directory / f"{prom}.pem"
            path.write_bytes(base64.b64decode(source[f"{key}-data"]))
            files[prom] = str(path)
    return urllib.parse.urlsplit(server["server"]).netloc, files


def rendered_dashboards(cluster: E2ECluster, release: Release) -> dict[str, dict[str, Any]]:
    out = cluster.helm("template", release.name, str(CHART), "--namespace", release.namespace,
                       "--set", "monitoring.dashboards.enabled=true",
                       "--show-only", "templates/monitoring/dashboards.yaml").stdout
    boards = [json.loads(text) for doc in yaml.safe_load_all(out) if doc for text in doc["data"].values()]
    return {board["uid"]: board for board in boards}


def rendered_rules(cluster: E2ECluster, release: Release) -> dict[str, Any]:
    out = cluster.helm("template", release.name, str(CHART), "--namespace", release.namespace,
                       "--set", "monitoring.prometheusRule.enabled=true",
                       "--show-only", "templates/monitoring/prometheusrule.yaml").stdout
    spec = yaml.safe_load(out)["spec"]
    for group in spec["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "GPUStackWebhookDown":
                rule["for"] = "5s"
    return dict(spec)


class Prometheus:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = controlplane.free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "prometheus.log"

    def start(self, config: dict[str, Any]) -> None:
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [prometheus_binary(), f"--config.file={self.workdir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.workdir)
        self.wait(lambda: self.get("/-/ready") is not None, "Prometheus ready")

    def get(self, path: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=5) as reply:
            body = reply.read().decode()
            return json.loads(body) if path.startswith("/api/") else body
        return None

    def query(self, promql: str) -> list[dict[str, Any]]:
        reply = self.get("/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        return list(reply["data"]["result"]) if reply and reply.get("status") == "success" else []

    def alerts(self, name: str) -> list[dict[str, Any]]:
        reply = self.get("/api/v1/alerts")
        found = reply["data"]["alerts"] if reply else []
        return [a for a in found if a["labels"].get("alertname") == name]

    def wait(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        while not condition():
            if time.monotonic() > deadline:
                log = self.log_path.read_text(errors="replace")[-3000:]
                raise AssertionError(f"{what}: not within {WAIT_SECONDS} s\n{log}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    server = Prometheus(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def webhook_targets(path: Path, release: Release, hook: LiveWebhook) -> None:
    """The file_sd target list Prometheus watches: the live webhook as the chart's ServiceMonitor labels it."""
    path.write_text(json.dumps([{"targets": [f"127.0.0.1:{hook.port}"],
                                 "labels": {"namespace": release.namespace}}]))


def repoint_urls(cluster: E2ECluster, release: Release, hook: LiveWebhook) -> None:
    """LiveWebhook.repoint turns service references into loopback URLs; this moves those URLs to a new one."""
    assert hook.pki is not None
    ca = base64.b64encode(hook.pki.ca_cert.read_bytes()).decode()
    for kind in WEBHOOK_KINDS:
        for obj in cluster.get_json(kind, "-l", release.selector)["items"]:
            patch = [{"op": "replace", "path": f"/webhooks/{i}/clientConfig",
                      "value": {"url": f"https://127.0.0.1:{hook.port}{urllib.parse.urlsplit(url).path}",
                                "caBundle": ca}}
                     for i, w in enumerate(obj["webhooks"]) if (url := w["clientConfig"].get("url"))]
            cluster.kubectl("patch", kind, obj["metadata"]["name"], "--type=json", "-p", json.dumps(patch))


def test_prometheus_scrapes_the_webhook_and_the_api_server_and_the_webhook_down_alert_fires_and_resolves(
        cluster: E2ECluster, releases: Releases, live_webhook: Callable[..., LiveWebhook], prometheus: Prometheus,
        tmp_path: Path) -> None:
    started = time.time()
    release, _ = releases.install()
    pods_namespace = cluster.create_namespace()
    hook = live_webhook(release, probe_namespace=pods_namespace)
    apiserver, kube_tls = kube_credentials(cluster, tmp_path)
    targets = tmp_path / "webhook-targets.json"
    webhook_targets(targets, release, hook)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rendered_rules(cluster, release)))
    job = f"{release.fullname}-webhook"  # the Service name: the job label the ServiceMonitor gives
    prometheus.start({
        "global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE},
        "rule_files": [str(tmp_path / "rules.yaml")],
        "scrape_configs": [
            {"job_name": job, "scheme": "https", "metrics_path": "/metrics",
             # A new webhook process comes with a new loopback CA: the test skips verification (the chart's
             # ServiceMonitor verifies against the webhook's TLS Secret).
             "tls_config": {"insecure_skip_verify": True},
             "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}]},
            {"job_name": "apiserver", "scheme": "https", "tls_config": kube_tls,
             "static_configs": [{"targets": [apiserver]}]},
        ],
    })

    # The suite creates pods, GPU pods the webhook reviews (Pending for ever: the plane has no nodes), one per
    # poll until Prometheus has seen reviews arrive (a rate over what it scraped, not just a counter).
    created = iter(range(10_000))

    def create_pod_and_see_reviews(hook: LiveWebhook) -> bool:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"gpu-{next(created)}"},
               "spec": {"containers": [{"name": "cuda", "image": "nvcr.io/nvidia/cuda:12.5.0-base-ubuntu22.04",
                                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        cluster.kubectl("create", "-n", pods_namespace, "-f", "-", input=json.dumps(pod))
        return bool(prometheus.query(f'sum(rate(gpu_stack_admission_reviews_total{{job="{job}", '
                                     f'instance="127.0.0.1:{hook.port}"}}[1m])) > 0'))

    prometheus.wait(lambda: create_pod_and_see_reviews(hook), "the webhook's reviews scraped")
    prometheus.wait(lambda: bool(prometheus.query(
        'sum(apiserver_admission_webhook_admission_duration_seconds_count{name="validate.gpu-stack.io"}) > 0')),
        "the API server's calls of the webhook scraped")
    # The metrics the dashboards and alerts read, as the real processes name them.
    for name in ("gpu_stack_admission_duration_seconds_bucket", "gpu_stack_rule_findings_total",
                 "apiserver_admission_webhook_admission_duration_seconds_bucket",
                 "apiserver_admission_webhook_rejection_count"):
        assert prometheus.query(f"count({name})"), name
    assert prometheus.query(f'up{{job="{job}", namespace="{release.namespace}"}} == 1')
    # Before the first scrapes no target was up: the alert may have been pending (or, with `for` cut to 5 s,
    # firing) at startup; with the webhook scraped it is quiet.
    prometheus.wait(lambda: prometheus.alerts("GPUStackWebhookDown") == [], "GPUStackWebhookDown quiet while up")

    hook.stop()
    prometheus.wait(lambda: any(a["state"] == "firing" for a in prometheus.alerts("GPUStackWebhookDown")),
                    "GPUStackWebhookDown firing after the webhook stopped")
    (alert,) = prometheus.alerts("GPUStackWebhookDown")
    assert alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["runbook_url"].endswith("/docs/runbooks/GPUStackWebhookDown.md")

    back = live_webhook(release)  # a new process: a new port and a new loopback CA
    repoint_urls(cluster, release, back)
    back.wait_called(pods_namespace)
    webhook_targets(targets, release, back)
    prometheus.wait(lambda: prometheus.alerts("GPUStackWebhookDown") == [],
                    "GPUStackWebhookDown resolved with the webhook back")
    prometheus.wait(lambda: create_pod_and_see_reviews(back), "the new webhook's reviews scraped")

    # Pictures of the dashboards from this run's data (README), only when asked for.
    if directory := os.environ.get("GPU_STACK_PREVIEW_DIR"):
        caption = ("Each panel's queries evaluated against the Prometheus of a make e2e run (no GPU nodes there: "
                   "DCGM and kube-state-metrics panels show No data), drawn with matplotlib, not Grafana.")
        query = preview.prometheus_range(f"http://127.0.0.1:{prometheus.port}", started, time.time(), 1)
        drawn = preview.write_previews(rendered_dashboards(cluster, release), query, Path(directory), caption)
        assert any(d.series for d in drawn["gpu-stack-admission"])
