"""The NVIDIA DRA driver facts the policy relies on (policy/dra.py, config.DraPolicy, GPU009), each read from
the upstream file it comes from: kubernetes-sigs/dra-driver-nvidia-gpu at tag v0.4.1, copied unchanged into
tests/fixtures/dra-driver-nvidia-gpu-v0.4.1/ (see tests/fixtures/README.md: GPU Operator v26.7.0 pins the
driver's v0.5.0, a tag the repository copy we could read does not have)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from gpu_stack_webhook.policy import dra
from gpu_stack_webhook.policy.config import DRA_GPU_DEVICE_CLASSES, DRA_SHARING_STRATEGIES, DraPolicy
from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.desired import DesiredPod
from gpu_stack_webhook.policy.rules import dra_claims

from .policylib import make_config

UPSTREAM = Path(__file__).resolve().parents[1] / "fixtures" / "dra-driver-nvidia-gpu-v0.4.1"


def read(name: str) -> str:
    return (UPSTREAM / name).read_text(encoding="utf-8")


def test_device_class_names_and_driver() -> None:
    """deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-{gpu,mig,vfio-gpu}.yaml @ v0.4.1: three
    DeviceClasses, each selecting devices of driver gpu.nvidia.com by their `type` attribute."""
    found = {}
    for name in ("deviceclass-gpu.yaml", "deviceclass-mig.yaml", "deviceclass-vfio-gpu.yaml"):
        text = read(name)
        class_name = re.search(r"^  name: (\S+)$", text, re.M)
        selector = re.search(r'expression: "(.*)"', text)
        assert class_name and selector, name
        found[class_name.group(1)] = selector.group(1)
    assert found == {
        "gpu.nvidia.com": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        "mig.nvidia.com": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
        "vfio.gpu.nvidia.com":
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'vfio'",
    }
    assert set(found) == set(DRA_GPU_DEVICE_CLASSES) == set(DraPolicy().gpu_device_classes)
    assert all(f"device.driver == '{dra.DRIVER}'" in s for s in found.values())
    # The gpu class is also the DRA provider of nvidia.com/gpu (KEP-5004) on resource.k8s.io/v1.
    assert "extendedResourceName: nvidia.com/gpu" in read("deviceclass-gpu.yaml")


def test_opaque_config_group_version_and_kinds() -> None:
    """api/nvidia.com/resource/v1beta1/api.go @ v0.4.1: GroupName, Version and the config kinds with sharing."""
    text = read("api.go")
    assert re.search(r'GroupName = "resource\.nvidia\.com"', text)
    assert re.search(r'Version\s+= "v1beta1"', text)
    assert dra.CONFIG_API_VERSION == "resource.nvidia.com/v1beta1"
    for kind in dra.SHARING_KINDS:
        assert re.search(rf'{kind}Kind\s+= "{kind}"', text), kind


def test_sharing_strategies_and_json_fields() -> None:
    """api/nvidia.com/resource/v1beta1/sharing.go @ v0.4.1: the strategy values and the JSON field names."""
    text = read("sharing.go")
    strategies = dict(re.findall(r'^\s*(TimeSlicingStrategy|MpsStrategy)\s+= "(\w+)"', text, re.M))
    assert strategies == {"TimeSlicingStrategy": "TimeSlicing", "MpsStrategy": "MPS"}
    assert tuple(strategies.values()) == DRA_SHARING_STRATEGIES and strategies["MpsStrategy"] == dra.MPS
    tags = set(re.findall(r'json:"(\w+)', text))
    assert {"strategy", "timeSlicingConfig", "mpsConfig", "defaultActiveThreadPercentage",
            "defaultPinnedDeviceMemoryLimit", "defaultPerDevicePinnedMemoryLimit"} <= tags
    # defaultPinnedDeviceMemoryLimit is a resource.Quantity (the policy checks it parses as one).
    assert re.search(r"DefaultPinnedDeviceMemoryLimit \*resource\.Quantity", text)


def test_sharing_needs_feature_gates_off_by_default() -> None:
    """pkg/featuregates/featuregates.go @ v0.4.1: TimeSlicingSettings and MPSSupport, both Default false."""
    text = read("featuregates.go")
    for gate in dra_claims.FEATURE_GATES.values():
        block = re.search(rf"\t{gate}: {{\n\t\t{{\n\t\t\tDefault:\s+(\w+),", text)
        assert block and block.group(1) == "false", gate
    assert DraPolicy().sharing_strategies == ()


def test_the_mps_quickstart_is_read_as_upstream_wrote_it() -> None:
    """demo/specs/quickstart/v1/gpu-test-mps.yaml @ v0.4.1: a ResourceClaimTemplate with an MPS GpuConfig and
    a memory limit, and a pod whose containers name its request."""
    docs = list(yaml.safe_load_all(read("gpu-test-mps.yaml")))
    template = next(d for d in docs if d and d["kind"] == "ResourceClaimTemplate")
    spec = dra.claim_spec_of(template, "ResourceClaimTemplate")
    policy = DraPolicy()
    assert spec.gpu_request_names(policy) == {"mps-gpu"} and not spec.problems
    assert [(s.strategy, s.has_memory_limit, s.requests) for s in spec.sharing] == [("MPS", True, ("mps-gpu",))]
    assert spec.mps_for(policy, "mps-gpu")
    ctx = Context.for_config(make_config(dra={"sharingStrategies": ["MPS"]}))
    assert dra_claims.check_object(template, "ResourceClaimTemplate", DesiredPod(template), ctx) == []
    ctx = Context.for_config(make_config())
    [finding] = dra_claims.check_object(template, "ResourceClaimTemplate", DesiredPod(template), ctx)
    assert "GPU sharing strategy MPS is not enabled" in finding.message
