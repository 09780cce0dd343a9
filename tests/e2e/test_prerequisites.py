"""Every install a missing prerequisite breaks stops at once with our message (templates/validate.yaml)
naming what to install or which value to change, and leaves nothing behind (but the chart's crds/); with
the prerequisite there (tests/e2e/test_install.py) the same values install. The webhook image is one:
the chart's defaults name none."""

from __future__ import annotations

import pytest
from gpu_stack_dev.e2e.e2elib import E2ECluster, Release, Releases

from .test_install import NFD_CRDS, remove_nfd_crds

# The chart's defaults name no webhook image (none is published): templates/validate.yaml.
NO_WEBHOOK_IMAGE = (
    "gpu-stack: webhook.image.repository is empty and no gpu-stack-webhook image is published, so the webhook "
    "pods could not start and the API server could not reach the webhook it registers; build and push the image "
    "(make image IMAGE=<registry>/gpu-stack-webhook:<tag>, then push it to a registry your nodes pull from) and "
    "install with --set webhook.image.repository=<registry>/gpu-stack-webhook --set webhook.image.tag=<tag>, or "
    "run without the webhook, with the CEL admission policies only: --set webhook.validation.mode=cel "
    "--set webhook.mutation.mode=cel")

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
    pytest.param(
        "policy-only-gpu-operator.yaml", ["--set", "webhook.policySource.gpuOperator.namespace=no-gpu-operator"],
        'gpu-stack: webhook.policySource.mode is gpu-operator, but its namespace "no-gpu-operator" does not exist: '
        "install the GPU Operator first (or set webhook.policySource.gpuOperator.namespace to the namespace it runs "
        "in)", id="gpu-operator-namespace-missing"),
    pytest.param(
        "policy-only-device-plugin.yaml", ["--set", "webhook.policySource.devicePlugin.namespace=no-device-plugin"],
        'gpu-stack: webhook.policySource.mode is device-plugin, but its namespace "no-device-plugin" does not exist: '
        "install the device-plugin chart first (or set webhook.policySource.devicePlugin.namespace to the namespace "
        "it runs in)", id="device-plugin-namespace-missing"),
]


@pytest.mark.parametrize("helm_major", [4, 3])
@pytest.mark.parametrize(("overlay", "extra", "message"), CASES)
def test_missing_prerequisite_stops_with_our_message(cluster: E2ECluster, releases: Releases, overlay: str,
                                                     extra: list[str], message: str, helm_major: int) -> None:
    if "--skip-crds" in extra:
        remove_nfd_crds(cluster)
    release, proc = releases.install(overlay, helm_major=helm_major, extra=extra, check=False)
    assert_stopped_with(cluster, release, proc.returncode, proc.stderr, message)
    if "--skip-crds" in extra:
        assert cluster.kubectl("get", "crd", *NFD_CRDS, "--ignore-not-found", "-o", "name").stdout == ""


def assert_stopped_with(cluster: E2ECluster, release: Release, returncode: int, stderr: str, message: str) -> None:
    assert returncode == 1
    # Helm prefixes where the template failed: "Error: INSTALLATION FAILED: execution error at
    # (gpu-stack/templates/validate.yaml:LINE:COL): " and then our message, and nothing after it.
    assert stderr.rstrip().endswith(message), stderr
    assert "execution error at (gpu-stack/templates/validate.yaml:" in stderr
    assert "no matches for kind" not in stderr
    # Stopped before anything was created: no object of ours, no release record.
    left = cluster.kubectl("get", "all,configmaps,serviceaccounts,roles,rolebindings", "-n", release.namespace,
                           "-l", release.selector, "-o", "name").stdout
    assert left == ""
    for kind in ("clusterroles", "mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        assert cluster.kubectl("get", kind, "-l", release.selector, "-o", "name").stdout == ""
    helm = cluster.helm if release.helm_major == 4 else cluster.helm3
    history = helm("history", release.name, "-n", release.namespace, check=False)
    assert (history.returncode, history.stderr.strip()) == (1, "Error: release: not found")


@pytest.mark.parametrize("helm_major", [4, 3])
def test_install_without_a_webhook_image_stops_with_our_message(cluster: E2ECluster, releases: Releases,
                                                                helm_major: int) -> None:
    """`helm install gpu-stack charts/gpu-stack -n NS --create-namespace`, nothing set: no webhook pod could
    start, so the install stops before it registers a webhook that would judge the cluster's pods."""
    remove_nfd_crds(cluster)
    release, proc = releases.install(helm_major=helm_major, check=False, webhook_image=None)
    assert_stopped_with(cluster, release, proc.returncode, proc.stderr, NO_WEBHOOK_IMAGE)
    helm = cluster.helm if helm_major == 4 else cluster.helm3
    every_status = ["-a"] if helm_major == 3 else []  # Helm 4 lists releases in any status by default, has no -a
    assert helm("list", *every_status, "-q", "-n", release.namespace).stdout == ""
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):  # also by name, unlabelled
        assert cluster.kubectl("get", kind, f"{release.fullname}-webhook", "--ignore-not-found", "-o",
                               "name").stdout == ""
    # Helm creates the namespace (--create-namespace) only after the render succeeded: none, so nothing in it.
    assert cluster.kubectl("get", "namespace", release.namespace, "--ignore-not-found", "-o", "name").stdout == ""
    # What it leaves: the chart's crds/. Helm 3 and 4 (action/install.go) create crds/ before they render any
    # template, so the NFD CRDs this cluster lacked are there, as after any install (uninstall keeps them too);
    # with no NodeFeature objects they change nothing.
    assert cluster.kubectl("get", "crd", *NFD_CRDS, "-o", "name").stdout.split() == [
        f"customresourcedefinition.apiextensions.k8s.io/{name}" for name in NFD_CRDS]


@pytest.mark.parametrize("overlay", ["monitoring-prometheus-operator.yaml", "webhook-cert-manager.yaml"])
def test_offline_render_still_renders_the_custom_objects(cluster: E2ECluster, overlay: str) -> None:
    """`helm template` (GitOps, CI) does not talk to the cluster: the prerequisite check stays out of it."""
    from gpu_stack_dev.e2e.e2elib import CHART, values_args  # noqa: PLC0415

    out = cluster.helm("template", "gpu-stack", str(CHART), *values_args(overlay)).stdout
    assert ("kind: ServiceMonitor" in out) or ("kind: Certificate" in out)
