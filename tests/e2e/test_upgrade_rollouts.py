"""Upgrades on a real API server: a new chart version rolls no pod; a config change rolls its consumers only.

The API server bumps a workload's metadata.generation exactly when its spec changes, and the
DaemonSet/Deployment controllers roll pods exactly when spec.template changes, so generation and the
stored template are what a user's nodes would see. Also: the RuntimeClass lookup in validate.yaml
against the live API server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_dev.chartlib import next_chart_version
from gpu_stack_dev.e2e.e2elib import POLICY_ONLY_NAMESPACE, E2ECluster, Releases, overlays, unique

WORKLOAD_KINDS = ("daemonsets", "deployments")


def workloads(cluster: E2ECluster, namespace: str) -> dict[str, tuple[int, str]]:
    """kind/name -> (metadata.generation, spec.template as stored by the API server)."""
    out = {}
    for kind in WORKLOAD_KINDS:
        for item in cluster.get_json(kind, "-n", namespace)["items"]:
            template: dict[str, Any] = item["spec"]["template"]
            out[f'{kind}/{item["metadata"]["name"]}'] = (item["metadata"]["generation"],
                                                          json.dumps(template, sort_keys=True))
    return out


def changed(before: dict[str, tuple[int, str]], after: dict[str, tuple[int, str]]) -> set[str]:
    assert before.keys() == after.keys()
    moved = {k for k in before if before[k][0] != after[k][0]}
    # The stored template changed exactly where the generation moved.
    assert moved == {k for k in before if before[k][1] != after[k][1]}
    return moved


# Overlays whose objects need CRDs a bare API server does not serve.
NEEDS_CRDS = {"webhook-cert-manager.yaml": "cert-manager",
              "monitoring-prometheus-operator.yaml": "ServiceMonitor, PrometheusRule"}


@pytest.mark.parametrize(("overlay", "helm_major"),
                         [*((o, 4) for o in overlays() if o not in NEEDS_CRDS), ("mps-x10.yaml", 3)])
def test_new_chart_version_rolls_no_pod(cluster: E2ECluster, releases: Releases, tmp_path: Path,
                                        overlay: str, helm_major: int) -> None:
    release, _ = releases.install(overlay, helm_major=helm_major)
    before = workloads(cluster, release.namespace)
    assert len(before) >= (1 if overlay in POLICY_ONLY_NAMESPACE else 5)  # policy only: the webhook alone
    helm = releases.helm_for(helm_major)
    chart = next_chart_version(tmp_path)
    releases.upgrade(release, overlay, chart=chart, set_json={"webhook.timeoutSeconds": 7})
    history = json.loads(helm("history", release.name, "-n", release.namespace, "-o", "json").stdout)
    new_version = yaml.safe_load((chart / "Chart.yaml").read_text())["version"]
    assert history[-1]["chart"] == f"gpu-stack-{new_version}"
    assert changed(before, workloads(cluster, release.namespace)) == set()


def test_config_change_rolls_only_its_consumers(cluster: E2ECluster, releases: Releases) -> None:
    release, _ = releases.install()
    before = workloads(cluster, release.namespace)
    sharing = {"default": {}, "ts": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}
    releases.upgrade(release, set_json={"sharing.configs": sharing})
    after = workloads(cluster, release.namespace)
    fullname = release.fullname
    assert changed(before, after) == {f"daemonsets/{fullname}-device-plugin",
                                      f"daemonsets/{fullname}-gpu-feature-discovery",
                                      f"deployments/{fullname}-webhook"}
    releases.upgrade(release, set_json={"sharing.configs": sharing, "nfd.worker.sleepInterval": "120s"})
    assert changed(after, workloads(cluster, release.namespace)) == {f"daemonsets/{fullname}-nfd-worker"}


def test_missing_runtime_class_is_refused_at_install(cluster: E2ECluster, releases: Releases) -> None:
    runtime_class = unique("nvidia-e2e")
    values = {"toolkit.enabled": False, "gpuNodes.runtimeClassName": runtime_class}
    _, proc = releases.install(set_json=values, check=False)
    assert proc.returncode != 0
    assert (f'gpu-stack: gpuNodes.runtimeClassName is "{runtime_class}", but the chart does not create that '
            "RuntimeClass (toolkit.enabled=false) and the cluster serves none") in proc.stderr, proc.stderr
    rc = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": runtime_class},
          "handler": "nvidia"}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(rc))
    try:
        release, _ = releases.install(set_json=values, name=unique("gpu-stack"))
        [ds] = [d for d in cluster.get_json("daemonsets", "-n", release.namespace)["items"]
                if d["metadata"]["name"].endswith("-device-plugin")]
        assert ds["spec"]["template"]["spec"]["runtimeClassName"] == runtime_class
    finally:
        cluster.kubectl("delete", "runtimeclass", runtime_class, "--ignore-not-found")
