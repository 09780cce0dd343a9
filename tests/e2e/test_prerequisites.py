"""Every install a missing prerequisite breaks stops at once with our message (templates/validate.yaml)
naming what to install or which value to change, and leaves nothing behind; with the prerequisite
there (tests/e2e/test_install.py) the same values install."""

from __future__ import annotations

import pytest

from .e2elib import E2ECluster, Releases
from .test_install import NFD_CRDS, remove_nfd_crds

CASES = [
    pytest.param(
        "monitoring-prometheus-operator.yaml", [],
        "gpu-stack: dcgmExporter.serviceMonitor.enabled=true, but this cluster serves no monitoring.coreos.com/v1 "
        "ServiceMonitor: install the Prometheus Operator (e.g. kube-prometheus-stack) with its CRDs first, or set "
        "dcgmExporter.serviceMonitor.enabled=auto (a ServiceMonitor only where the API exists) or false",
        id="servicemonitor-crd-missing"),
    pytest.param(
        "default", ["--set", "monitoring.webhookServiceMonitor.enabled=true"],
        "gpu-stack: monitoring.webhookServiceMonitor.enabled=true, but this cluster serves no monitoring.coreos.com/v1 "
        "ServiceMonitor: install the Prometheus Operator (e.g. kube-prometheus-stack) with its CRDs first, or set "
        "monitoring.webhookServiceMonitor.enabled=auto (a ServiceMonitor only where the API exists) or false",
        id="webhook-servicemonitor-crd-missing"),
    pytest.param(
        "default", ["--set", "monitoring.prometheusRule.enabled=true"],
        "gpu-stack: monitoring.prometheusRule.enabled=true, but this cluster serves no monitoring.coreos.com/v1 "
        "PrometheusRule: install the Prometheus Operator (e.g. kube-prometheus-stack) with its CRDs first, or set "
        "monitoring.prometheusRule.enabled=auto (the alerts only where the API exists) or false",
        id="prometheusrule-crd-missing"),
    pytest.param(
        "webhook-cert-manager.yaml", [],
        "gpu-stack: webhook.tls.mode=cert-manager, but this cluster serves no cert-manager.io/v1 Certificate and "
        "Issuer: install cert-manager (with its CRDs) first, or set webhook.tls.mode=self-managed (the default: "
        "the webhook keeps its own CA and certificate, nothing else to install)",
        id="cert-manager-crds-missing"),
    pytest.param(
        "mig-single-all-1g.yaml", ["--skip-crds"],
        "gpu-stack: this cluster serves no nfd.k8s-sigs.io/v1alpha1 NodeFeatureRule, which nfd.enabled and "
        "migManager.defaultConfig need (and the chart's rule that sets nvidia.com/gpu.present): install "
        "without --skip-crds (the chart's crds/ holds the NFD CRDs), or "
        "apply them first with kubectl apply --server-side -f charts/gpu-stack/crds/",
        id="nfd-crds-skipped"),
]


@pytest.mark.parametrize("helm_major", [4, 3])
@pytest.mark.parametrize(("overlay", "extra", "message"), CASES)
def test_missing_prerequisite_stops_with_our_message(cluster: E2ECluster, releases: Releases, overlay: str,
                                                     extra: list[str], message: str, helm_major: int) -> None:
    if "--skip-crds" in extra:
        remove_nfd_crds(cluster)
    release, proc = releases.install(overlay, helm_major=helm_major, extra=extra, check=False)
    assert proc.returncode == 1
    # Helm prefixes where the template failed: "Error: INSTALLATION FAILED: execution error at
    # (gpu-stack/templates/validate.yaml:LINE:COL): " and then our message, and nothing after it.
    assert proc.stderr.rstrip().endswith(message), proc.stderr
    assert "execution error at (gpu-stack/templates/validate.yaml:" in proc.stderr
    assert "no matches for kind" not in proc.stderr
    # Stopped before anything was created: no object of ours, no release record.
    left = cluster.kubectl("get", "all,configmaps,serviceaccounts,roles,rolebindings", "-n", release.namespace,
                           "-l", release.selector, "-o", "name").stdout
    assert left == ""
    for kind in ("clusterroles", "mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        assert cluster.kubectl("get", kind, "-l", release.selector, "-o", "name").stdout == ""
    helm = cluster.helm if helm_major == 4 else cluster.helm3
    history = helm("history", release.name, "-n", release.namespace, check=False)
    assert (history.returncode, history.stderr.strip()) == (1, "Error: release: not found")
    if "--skip-crds" in extra:
        assert cluster.kubectl("get", "crd", *NFD_CRDS, "--ignore-not-found", "-o", "name").stdout == ""


@pytest.mark.parametrize("overlay", ["monitoring-prometheus-operator.yaml", "webhook-cert-manager.yaml"])
def test_offline_render_still_renders_the_custom_objects(cluster: E2ECluster, overlay: str) -> None:
    """`helm template` (GitOps, CI) does not talk to the cluster: the prerequisite check stays out of it."""
    from .e2elib import CHART, values_args  # noqa: PLC0415

    out = cluster.helm("template", "gpu-stack", str(CHART), *values_args(overlay)).stdout
    assert ("kind: ServiceMonitor" in out) or ("kind: Certificate" in out)
