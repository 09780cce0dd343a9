"""Render-time checks: every `fail` in the chart's templates (validate.yaml and helpers) is triggered
by a case here that asserts its message, and every message starts with "gpu-stack: "."""

from __future__ import annotations

import re
from typing import Any

import pytest
from gpu_stack_dev.chartlib import CHART, render

GPU = [{"name": "nvidia.com/gpu", "replicas": 2}]
MIG_1G = [{"name": "nvidia.com/mig-1g.5gb", "replicas": 2}]

# (values set with --set-json, namespace, expected message fragment). Each fragment begins with the
# static start of one `fail` message (up to its first printf verb), so the coverage test below can
# match cases to checks.
FAIL_CASES: list[Any] = [
    pytest.param({"webhook.replicas": 1}, "gpu-stack",
                 "gpu-stack: webhook.podDisruptionBudget.minAvailable (1) must be less than webhook.replicas (1)",
                 id="webhook-pdb-blocks-drains"),
    pytest.param({"webhook.replicas": 3, "webhook.podDisruptionBudget.minAvailable": 3}, "gpu-stack",
                 "gpu-stack: webhook.podDisruptionBudget.minAvailable (3) must be less than webhook.replicas (3)",
                 id="webhook-pdb-equal"),
    pytest.param({"webhook.tls.mode": "secret"}, "gpu-stack",
                 "gpu-stack: webhook.tls.mode is secret but webhook.tls.caBundle is empty: create a kubernetes.io/tls "
                 'Secret "t-gpu-stack-webhook-tls" in namespace "gpu-stack"',
                 id="webhook-secret-mode-without-ca"),
    pytest.param({"webhook.tls.caBundle": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----"},
                 "gpu-stack", "gpu-stack: webhook.tls.caBundle is set but webhook.tls.mode is self-managed, which sets "
                 "the caBundle itself", id="webhook-ca-bundle-ignored"),
    pytest.param({"webhook.helmTests.namespace": "kube-system"}, "gpu-stack",
                 'gpu-stack: webhook.helmTests.namespace "kube-system" is exempt from the webhook '
                 "(exempt: gpu-stack, kube-system)",
                 id="webhook-test-namespace-exempt"),
    pytest.param({"webhook.helmTests.namespace": "ml", "webhook.policy.extraExemptNamespaces": ["ml"]}, "gpu-stack",
                 'gpu-stack: webhook.helmTests.namespace "ml" is exempt from the webhook', id="webhook-test-ns-extra"),
    # helm template sees no cluster: the CEL modes need the kinds served (or --api-versions / assumeServed)
    pytest.param({"webhook.validation.mode": "cel"}, "gpu-stack",
                 "gpu-stack: webhook.validation.mode is cel, but the API server does not serve "
                 "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy", id="webhook-cel-validation-not-served"),
    pytest.param({"webhook.mutation.mode": "cel"}, "gpu-stack",
                 "gpu-stack: webhook.mutation.mode is cel, but the API server does not serve "
                 "admissionregistration.k8s.io/v1 MutatingAdmissionPolicy", id="webhook-cel-mutation-not-served"),
    # ---- GPU-side checks ----
    pytest.param({"sharing.defaultConfig": "missing"}, "gpu-stack",
                 'gpu-stack: sharing.defaultConfig "missing" names no config in sharing.configs (default)',
                 id="sharing-default-config-missing"),
    pytest.param({"toolkit.runtime": "docker"}, "gpu-stack",
                 'gpu-stack: toolkit.runtime "docker" is not a known preset; use one of containerd, crio, k3s, rke2',
                 id="toolkit-runtime-unknown"),
    pytest.param({"devicePlugin.deviceListStrategy": ["envvar"]}, "gpu-stack",
                 "gpu-stack: devicePlugin.deviceListStrategy contains envvar, but the toolkit ignores "
                 "NVIDIA_VISIBLE_DEVICES from unprivileged containers", id="envvar-unprivileged"),
    # ---- DRA: the provider term of the GPU node affinity (templates/dra/_dra.tpl) must not be replaced ----
    pytest.param({"dra.enabled": True, "devicePlugin.affinity": {"nodeAffinity": {}}}, "gpu-stack",
                 "gpu-stack: devicePlugin.affinity is set while dra.enabled=true: it replaces the GPU node affinity, "
                 "which keeps the devicePlugin off nodes labelled gpu-stack.io/gpu-provider=dra",
                 id="dra-device-plugin-affinity"),
    # ---- runtime layout and sharing configs as the pinned device plugin v0.20 reads them ----
    pytest.param({"toolkit.enabled": False, "devicePlugin.deviceListStrategy": ["envvar"]}, "gpu-stack",
                 "gpu-stack: devicePlugin.deviceListStrategy contains envvar with a preinstalled toolkit "
                 "(toolkit.enabled=false): a toolkit that honours NVIDIA_VISIBLE_DEVICES", id="envvar-preinstalled"),
    # What the plugin refuses to load (it would restart on every node using the config): k8s-device-plugin
    # v0.20.0 api/config/v1/replicas.go (replicas >= 2), resources.go NewResourceName (a DNS-1123 name).
    pytest.param({"sharing.configs": {"default": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 0}]}}}}, "gpu-stack",
                 "gpu-stack: sharing.configs.default.timeSlicing.resources nvidia.com/gpu sets replicas 0; the device "
                 "plugin (v0.20.0) refuses a config with fewer than 2 replicas", id="sharing-replicas-0"),
    pytest.param({"sharing.configs": {"default": {"mps": {"resources": [{"name": "gpu", "replicas": 1}]}}}},
                 "gpu-stack", "gpu-stack: sharing.configs.default.mps.resources nvidia.com/gpu sets replicas 1",
                 id="sharing-replicas-1"),
    pytest.param({"sharing.configs": {"default": {"timeSlicing": {"resources": [
        {"name": "example.com/gpu", "replicas": 2}]}}}}, "gpu-stack",
                 'gpu-stack: sharing.configs.default.timeSlicing.resources names "example.com/gpu", which the device '
                 "plugin (v0.20.0) refuses", id="sharing-name-other-domain"),
    pytest.param({"sharing.configs": {"default": {"migStrategy": "mixed", "timeSlicing": {"resources": [
        {"name": "nvidia.com/mig-1g.10gb+me", "replicas": 2}]}}}, "migManager.enabled": True}, "gpu-stack",
                 'gpu-stack: sharing.configs.default.timeSlicing.resources names "nvidia.com/mig-1g.10gb+me", which '
                 "the device plugin (v0.20.0) refuses", id="sharing-name-plus"),
    pytest.param({"sharing.configs": {"default": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/GPU", "replicas": 2}]}}}}, "gpu-stack",
                 'gpu-stack: sharing.configs.default.timeSlicing.resources names "nvidia.com/GPU"',
                 id="sharing-name-upper-case"),
    pytest.param({"sharing.configs": {"default": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu.shared", "replicas": 2}]}}}}, "gpu-stack",
                 "gpu-stack: sharing.configs.default.timeSlicing.resources names nvidia.com/gpu.shared, a resource the "
                 "device plugin has no devices for", id="sharing-name-no-devices"),
    # k8s-device-plugin v0.20.0 api/config/v1/config.go DisableResourceNamingInConfig: rename is dropped
    pytest.param({"sharing.configs": {"default": {"timeSlicing": {"resources": [
        {"name": "gpu", "rename": "gpu-ts", "replicas": 4}]}}}}, "gpu-stack",
                 'gpu-stack: sharing.configs.default.timeSlicing.resources nvidia.com/gpu sets rename "gpu-ts", '
                 "which the pinned device plugin (v0.20.0) ignores", id="sharing-rename-ignored"),
    # ... and devices reset to all
    pytest.param({"sharing.configs": {"default": {"mps": {"resources": [
        {"name": "nvidia.com/gpu", "devices": [0], "replicas": 4}]}}}}, "gpu-stack",
                 "gpu-stack: sharing.configs.default.mps.resources nvidia.com/gpu sets devices [0], which the pinned "
                 "device plugin (v0.20.0) ignores", id="sharing-devices-ignored"),
    # bare names are prefixed (api/config/v1/resources.go NewResourceName): mig-1g.5gb is nvidia.com/mig-1g.5gb
    pytest.param({"sharing.configs": {"default": {"migStrategy": "single", "timeSlicing": {"resources": [
        {"name": "mig-1g.5gb", "replicas": 2}]}}}}, "gpu-stack",
                 'gpu-stack: sharing.configs.default.timeSlicing shares nvidia.com/mig-1g.5gb, but with migStrategy '
                 '"single"', id="sharing-bare-mig-name-normalised"),
    pytest.param({"toolkit.acceptVolumeMounts": False}, "gpu-stack",
                 "gpu-stack: devicePlugin.deviceListStrategy contains volume-mounts, but "
                 "toolkit.acceptVolumeMounts=false",
                 id="volume-mounts-not-accepted"),
    pytest.param({"devicePlugin.deviceListStrategy": ["cdi-annotations"]}, "gpu-stack",
                 'gpu-stack: devicePlugin.deviceListStrategy ["cdi-annotations"] uses CDI, but '
                 "toolkit.cdi.enabled=false",
                 id="cdi-without-cdi"),
    pytest.param({"sharing.configs": {"default": {"timeSlicing": {"resources": GPU}, "mps": {"resources": GPU}}}},
                 "gpu-stack", "gpu-stack: sharing.configs.default sets both timeSlicing and mps", id="ts-and-mps"),
    pytest.param({"sharing.configs": {"default": {"migStrategy": "single", "timeSlicing": {"resources": MIG_1G}}}},
                 "gpu-stack", 'gpu-stack: sharing.configs.default.timeSlicing shares nvidia.com/mig-1g.5gb, but with '
                 'migStrategy "single" the device plugin exposes no nvidia.com/mig-* resources',
                 id="mig-resource-not-mixed"),
    pytest.param({"sharing.configs": {"default": {"migStrategy": "mixed", "mps": {"resources": GPU}}}},
                 "gpu-stack", 'gpu-stack: sharing.configs.default combines mps with migStrategy "mixed"',
                 id="mps-on-mig"),
    pytest.param({"sharing.configs": {"default": {"mps": {"resources": GPU}}}, "devicePlugin.enabled": False},
                 "gpu-stack", "gpu-stack: sharing configs default use MPS, which needs the device plugin",
                 id="mps-without-device-plugin"),
    pytest.param({"sharing.configs": {"default": {"mps": {"resources": GPU}}}, "mpsControlDaemon.enabled": False},
                 "gpu-stack", "gpu-stack: sharing configs default use MPS but mpsControlDaemon.enabled=false",
                 id="mps-without-daemon"),
    pytest.param({"migManager.enabled": True, "migManager.defaultConfig": "all-disabled", "nfd.enabled": False,
                  "sharing.configs": {"default": {"migStrategy": "single"}}},
                 "gpu-stack", "gpu-stack: migManager.defaultConfig is applied by an NFD NodeFeatureRule, but "
                 "nfd.enabled=false", id="mig-default-without-nfd"),
    pytest.param({"migManager.enabled": True}, "gpu-stack",
                 "gpu-stack: migManager.enabled=true but every sharing config has migStrategy none",
                 id="mig-manager-without-mig-strategy"),
    pytest.param({"nfd.installCRDs": True}, "gpu-stack",
                 "gpu-stack: nfd.installCRDs was removed: the NFD CRDs are now in the chart's crds/ directory",
                 id="removed-nfd-install-crds"),
    # helm template has no cluster: lookup finds no RuntimeClass, as on a cluster without one.
    pytest.param({"toolkit.enabled": False}, "gpu-stack",
                 'gpu-stack: gpuNodes.runtimeClassName is "nvidia", but the chart does not create that RuntimeClass '
                 "(toolkit.enabled=false) and the cluster serves none", id="runtime-class-missing-toolkit-off"),
    pytest.param({"toolkit.runtimeClass.create": False}, "gpu-stack",
                 'gpu-stack: gpuNodes.runtimeClassName is "nvidia", but the chart does not create that RuntimeClass '
                 "(toolkit.runtimeClass.create=false)", id="runtime-class-missing-not-created"),
    pytest.param({"toolkit.runtimeClass.name": "nvidia-cdi"}, "gpu-stack",
                 'gpu-stack: gpuNodes.runtimeClassName is "nvidia", but the chart does not create that RuntimeClass '
                 '(the toolkit\'s RuntimeClass is "nvidia-cdi")', id="runtime-class-name-mismatch"),
    # Policy only (docs/gpu-operator.md): another project runs the node agents and the policy is read live.
    pytest.param({"webhook.policySource.mode": "gpu-operator"}, "gpu-stack",
                 "gpu-stack: webhook.policySource.mode is gpu-operator, so the GPU Operator already runs the GPU node "
                 "agents, but nfd.enabled, toolkit.enabled, devicePlugin.enabled, gfd.enabled, "
                 "mpsControlDaemon.enabled, dcgmExporter.enabled would install this chart's as well",
                 id="policy-only-with-agents"),
    pytest.param({"webhook.policySource.mode": "device-plugin", "devicePlugin.enabled": False, "nfd.enabled": False,
                  "toolkit.enabled": False, "gfd.enabled": False, "mpsControlDaemon.enabled": False,
                  "dcgmExporter.enabled": False, "webhook.validation.mode": "both", "webhook.mutation.mode": "cel",
                  "webhook.cel.assumeServed": True}, "gpu-stack",
                 "gpu-stack: webhook.policySource.mode is device-plugin, which the webhook reads live, but "
                 "webhook.validation.mode is both and webhook.mutation.mode cel", id="policy-only-cel-mutation"),
    pytest.param({"webhook.policySource.mode": "device-plugin", "devicePlugin.enabled": False, "nfd.enabled": False,
                  "toolkit.enabled": False, "gfd.enabled": False, "mpsControlDaemon.enabled": False,
                  "dcgmExporter.enabled": False}, "gpu-stack",
                 "gpu-stack: webhook.policySource.mode is device-plugin, but "
                 "webhook.policySource.devicePlugin.namespace and .configMap do not both name",
                 id="policy-only-device-plugin-unnamed"),
    pytest.param({"webhook.policy.nonGpuRuntimeClassNames": ["gvisor", "nvidia"]}, "gpu-stack",
                 "gpu-stack: webhook.policy.nonGpuRuntimeClassNames names nvidia, which this release makes a GPU "
                 "runtime class", id="non-gpu-runtime-class-is-gpu"),
    pytest.param({"monitoring.idleGpu.window": "4m"}, "gpu-stack",
                 'gpu-stack: monitoring.idleGpu.window "4m" is under 5m, so a GPU would count as idle after a handful',
                 id="idle-gpu-window-under-5m"),
]


@pytest.mark.parametrize(("set_json", "namespace", "message"), FAIL_CASES)
def test_fail_check_triggers(helm: int, set_json: dict[str, Any], namespace: str, message: str) -> None:
    result = render(helm, set_json=set_json, namespace=namespace)
    assert not result.ok, f"render with {set_json} should fail"
    assert message in result.stderr, result.stderr


def test_valid_neighbours_of_fail_cases_render() -> None:
    """The checks fire on the bad values only: the closest good values render."""
    ca = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----"
    for set_json in (
        {"webhook.replicas": 1, "webhook.podDisruptionBudget.enabled": False},
        {"webhook.replicas": 3, "webhook.podDisruptionBudget.minAvailable": 2},
        {"webhook.tls.mode": "secret", "webhook.tls.caBundle": ca},
        {"webhook.tls.mode": "cert-manager"},
        {"webhook.helmTests.namespace": "ml"},
        {"webhook.policy.nonGpuRuntimeClassNames": ["gvisor", "kata"]},
        {"webhook.enabled": False, "webhook.tls.mode": "secret"},
        {"toolkit.enabled": False, "gpuNodes.runtimeClassExists": True},
        {"toolkit.enabled": False, "gpuNodes.runtimeClassName": ""},
        {"toolkit.runtimeClass.name": "nvidia-cdi", "gpuNodes.runtimeClassName": "nvidia-cdi"},
        {"toolkit.enabled": False, "devicePlugin.enabled": False, "gfd.enabled": False, "dcgmExporter.enabled": False},
        {"sharing.configs": {"default": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}}}},
        {"sharing.configs": {"default": {"migStrategy": "mixed", "timeSlicing": {"resources": [
            {"name": "nvidia.com/mig-1g.10gb.me", "replicas": 2}]}}}, "migManager.enabled": True},
    ):
        result = render(3, set_json=set_json)
        assert result.ok, (set_json, result.stderr)


FAIL_CALL = re.compile(r'\bfail\s*\(?\s*(?:printf\s+)?"((?:[^"\\]|\\.)*)"')


def _fail_messages() -> list[tuple[str, str]]:
    found = []
    for path in sorted((CHART / "templates").rglob("*")):
        if path.is_file() and path.suffix in (".yaml", ".tpl", ".txt"):
            for m in FAIL_CALL.finditer(path.read_text(encoding="utf-8")):
                found.append((path.relative_to(CHART).as_posix(), m.group(1).replace('\\"', '"')))
    return found


def test_fail_messages_start_with_gpu_stack() -> None:
    messages = _fail_messages()
    assert messages, "no fail checks found: the scanner is broken"
    assert [m for m in messages if not m[1].startswith("gpu-stack: ")] == []


def test_every_fail_check_has_a_triggering_case() -> None:
    # The cluster-prerequisite checks fire only when Helm talks to a cluster: make e2e triggers them.
    from tests.chart.test_kubernetes_versions import MESSAGES as VERSION_CASES  # noqa: PLC0415
    from tests.e2e.test_non_gpu_runtime_classes import EXISTING_NVIDIA_GVISOR  # noqa: PLC0415
    from tests.e2e.test_prerequisites import CASES as CLUSTER_CASES  # noqa: PLC0415
    from tests.e2e.test_prerequisites import NO_WEBHOOK_IMAGE  # noqa: PLC0415

    expected = [p.values[2] for p in FAIL_CASES] + [p.values[2] for p in CLUSTER_CASES]
    expected += [NO_WEBHOOK_IMAGE, EXISTING_NVIDIA_GVISOR]
    expected += list(VERSION_CASES)
    uncovered = []
    for path, message in _fail_messages():
        static = re.split(r"%[-+# 0-9.]*[a-zA-Z]", message, maxsplit=1)[0]
        # A case's message starts with the static text (up to the first verb), or, for a message
        # without verbs, is a long enough prefix of it.
        if not any(e.startswith(static) or (static.startswith(e) and len(e) >= 40) for e in expected):
            uncovered.append(f"{path}: {message[:100]}")
    assert uncovered == [], "fail checks without a test case in FAIL_CASES"
