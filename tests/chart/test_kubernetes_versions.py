"""What the chart does on each Kubernetes minor, with real Helm 3 and 4 told the cluster's version and the API
versions it serves (`--kube-version`, `--api-versions`, as `helm install` learns them from the API server's
discovery): an overlay or mode that needs a newer API stops the render with a `gpu-stack:` message naming the
version found, the one needed and the alternative. The older (beta/alpha) versions of those APIs are refused,
not used (docs/kubernetes-versions.md says why). The same against real 1.32/1.34/1.36 API servers:
tests/e2e/test_kubernetes_minors.py."""

from __future__ import annotations

import pytest
import yaml
from gpu_stack_dev.chartlib import CHART, Render, run_helm, template_args

DRA = "gpu-stack: dra.enabled=true needs resource.k8s.io/v1 DeviceClass (Kubernetes >= 1.34), but found "
DRA_ALTERNATIVES = ("; upgrade the cluster to Kubernetes 1.34 or later, or install without the DRA overlay "
                    "(dra.enabled=false: the device plugin serves the GPUs), or with helm template pass "
                    "--api-versions resource.k8s.io/v1/DeviceClass")
MAP = ("gpu-stack: webhook.mutation.mode is cel, but the API server does not serve admissionregistration.k8s.io/v1 "
       "MutatingAdmissionPolicy (Kubernetes >= 1.36; found ")
MAP_ALTERNATIVES = ("), so GPU limits and MPS settings would not be filled in; use webhook.mutation.mode=webhook "
                    "(any Kubernetes >= 1.32), or upgrade the cluster to 1.36, or with helm template pass "
                    "--api-versions admissionregistration.k8s.io/v1/MutatingAdmissionPolicy "
                    "(or set webhook.cel.assumeServed=true)")
# Only where Helm talks to a cluster (validate.yaml's cluster section): tests/e2e/test_kubernetes_minors.py.
CEL_LISTS = "gpu-stack: webhook.validation.mode is cel, but Kubernetes "
CEL_LISTS_REST = (" compiles no ValidatingAdmissionPolicy of this chart: they use the CEL lists extension "
                  "(lists.range, flatten), which the API server compiles from Kubernetes 1.36 (1.32 and 1.34 "
                  "refuse them); use webhook.validation.mode=webhook (any Kubernetes >= 1.32), or upgrade the "
                  "cluster to 1.36")
# The messages' static starts, for tests/chart/test_checks.py's coverage of every `fail`.
MESSAGES = (DRA, MAP, "gpu-stack: webhook.validation.mode is ")

# What each minor serves by default (no feature gates, no --runtime-config), as ../shared/envtest/README.md and
# the API servers' discovery say; 1.33 from kubernetes v1.33.0 (resource.k8s.io v1beta2 added, still off).
SERVED = {
    "1.32.13": ["admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"],
    "1.34.9": ["admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy", "resource.k8s.io/v1/DeviceClass"],
    "1.36.2": ["admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy", "resource.k8s.io/v1/DeviceClass",
               "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"],
}


def render_for(helm: int, overlay: str, kube_version: str | None, served: list[str],
               set_json: dict[str, object] | None = None) -> Render:
    args = template_args(overlay, set_json, api_versions=[a for v in served for a in ("--api-versions", v)])
    if kube_version:
        args += ["--kube-version", kube_version]
    return run_helm(helm, args)


def refused(result: Render) -> str:
    assert not result.ok, "rendered, but should have stopped"
    assert "no matches for kind" not in result.stderr
    line = next(line for line in result.stderr.splitlines() if "gpu-stack: " in line)
    return line[line.index("gpu-stack: "):]


@pytest.mark.parametrize("overlay", ["dra.yaml", "dra-mps-memory-slices.yaml"])
@pytest.mark.parametrize(("kube_version", "served", "found"), [
    # 1.32's default: resource.k8s.io off
    ("1.32.13", SERVED["1.32.13"], "Kubernetes v1.32.13, which serves no resource.k8s.io DeviceClass"),
    # 1.32 / 1.33 with DRA's beta switched on (--runtime-config, DynamicResourceAllocation gate): refused
    ("1.32.13", [*SERVED["1.32.13"], "resource.k8s.io/v1beta1/DeviceClass"],
     "Kubernetes v1.32.13, which serves resource.k8s.io DeviceClass only as v1beta1, which the chart does not use"),
    ("1.33.5", [*SERVED["1.32.13"], "resource.k8s.io/v1beta1/DeviceClass", "resource.k8s.io/v1beta2/DeviceClass"],
     "Kubernetes v1.33.5, which serves resource.k8s.io DeviceClass only as v1beta2, v1beta1, which the chart does "
     "not use"),
    # a 1.34 whose operator switched resource.k8s.io/v1 off
    ("1.34.9", SERVED["1.32.13"], "Kubernetes v1.34.9, which serves no resource.k8s.io DeviceClass"),
])
def test_dra_overlays_stop_where_resource_k8s_io_v1_is_not_served(helm: int, overlay: str, kube_version: str,
                                                                   served: list[str], found: str) -> None:
    assert refused(render_for(helm, overlay, kube_version, served)) == DRA + found + DRA_ALTERNATIVES


@pytest.mark.parametrize("overlay", ["dra.yaml", "dra-mps-memory-slices.yaml"])
def test_helm_template_without_api_versions_stops_dra_with_the_message(helm: int, overlay: str) -> None:
    """Helm's own default API list (no cluster) names versions but no kinds: the render asks for the flag."""
    message = refused(render_for(helm, overlay, None, []))
    assert message.startswith(DRA + "Kubernetes v1.3"), message
    assert message.endswith(", which serves no resource.k8s.io DeviceClass" + DRA_ALTERNATIVES)


@pytest.mark.parametrize("kube_version", ["1.34.9", "1.36.2"])
@pytest.mark.parametrize("overlay", ["dra.yaml", "dra-mps-memory-slices.yaml"])
def test_dra_overlays_render_where_v1_is_served(helm: int, overlay: str, kube_version: str) -> None:
    result = render_for(helm, overlay, kube_version, SERVED[kube_version])
    assert result.ok, result.stderr
    classes = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "DeviceClass"]
    assert {(d["apiVersion"], d["metadata"]["name"]) for d in classes} == {
        ("resource.k8s.io/v1", "gpu.nvidia.com"), ("resource.k8s.io/v1", "mig.nvidia.com"),
        ("resource.k8s.io/v1", "vfio.gpu.nvidia.com")}


@pytest.mark.parametrize(("kube_version", "served", "found"), [
    ("1.32.13", SERVED["1.32.13"], "Kubernetes v1.32.13, which serves no admissionregistration.k8s.io "
                                   "MutatingAdmissionPolicy"),
    # an API server that serves it only as v1alpha1 (1.32/1.33 with the alpha gate and runtime-config)
    ("1.32.13", [*SERVED["1.32.13"], "admissionregistration.k8s.io/v1alpha1/MutatingAdmissionPolicy"],
     "Kubernetes v1.32.13, which serves admissionregistration.k8s.io MutatingAdmissionPolicy only as v1alpha1, "
     "which the chart does not use"),
    ("1.34.9", SERVED["1.34.9"], "Kubernetes v1.34.9, which serves no admissionregistration.k8s.io "
                                 "MutatingAdmissionPolicy"),
    # 1.34/1.35 with the beta gate and runtime-config: refused too
    ("1.34.9", [*SERVED["1.34.9"], "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy"],
     "Kubernetes v1.34.9, which serves admissionregistration.k8s.io MutatingAdmissionPolicy only as v1beta1, "
     "which the chart does not use"),
])
def test_cel_mutation_stops_below_1_36(helm: int, kube_version: str, served: list[str], found: str) -> None:
    result = render_for(helm, "default", kube_version, served, {"webhook.mutation.mode": "cel"})
    assert refused(result) == MAP + found + MAP_ALTERNATIVES


def test_helm_template_without_api_versions_stops_cel_mutation_with_the_message(helm: int) -> None:
    """No cluster, no --api-versions: Helm's own list names no MutatingAdmissionPolicy kind; the render asks for the
    flag (or webhook.cel.assumeServed) instead of writing policies the cluster may not serve."""
    message = refused(render_for(helm, "default", None, [], {"webhook.mutation.mode": "cel"}))
    assert message.startswith(MAP + "Kubernetes v1.3"), message
    assert message.endswith(", which serves no admissionregistration.k8s.io MutatingAdmissionPolicy"
                            + MAP_ALTERNATIVES)


@pytest.mark.parametrize("kube_version", ["1.32.13", "1.34.9", "1.36.2"])
def test_cel_validation_renders_without_a_cluster_on_every_minor(helm: int, kube_version: str) -> None:
    """helm template knows no server version (its own default): the 1.36 floor of the policies' CEL is checked
    where Helm talks to the cluster (tests/e2e/test_kubernetes_minors.py: refused on 1.32 and 1.34)."""
    result = render_for(helm, "default", kube_version, SERVED[kube_version], {"webhook.validation.mode": "cel"})
    assert result.ok, result.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(result.stdout) if d}
    assert "ValidatingAdmissionPolicy" in kinds


def test_cel_mutation_renders_on_1_36() -> None:
    result = render_for(4, "default", "1.36.2", SERVED["1.36.2"], {"webhook.mutation.mode": "cel"})
    assert result.ok, result.stderr
    assert "MutatingAdmissionPolicy" in {d["kind"] for d in yaml.safe_load_all(result.stdout) if d}


@pytest.mark.parametrize("kube_version", ["1.31.9", "1.29.0"])
def test_kube_version_below_the_proven_floor_is_refused(helm: int, kube_version: str) -> None:
    """Chart.yaml's kubeVersion is what tests/e2e/test_kubernetes_minors.py proves (1.32 and later)."""
    result = render_for(helm, "default", kube_version, SERVED["1.32.13"])
    assert not result.ok
    assert f"chart requires kubeVersion: >=1.32.0-0 which is incompatible with Kubernetes v{kube_version}" \
        in result.stderr, result.stderr
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"] == ">=1.32.0-0"
