"""The GPU Operator's objects as the e2e harness builds them from the operator's own files (gpu_operator.py runs
the operator): its chart's RBAC for another namespace, a ClusterPolicy with overrides, and the workload pods its
validator creates itself."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml


def rbac_for(rbac_yaml: str, namespace: str) -> list[dict[str, Any]]:
    """The chart's operator RBAC (rendered for namespace gpu-operator) for another namespace."""
    docs = [d for d in yaml.safe_load_all(rbac_yaml) if d]
    for doc in docs:
        if "namespace" in doc["metadata"]:
            doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects", []):
            if subject.get("kind") == "ServiceAccount":
                subject["namespace"] = namespace
    return docs


def merged(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` merged in, maps recursively (a JSON merge patch without deletions)."""
    out = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        out[key] = merged(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) \
            else copy.deepcopy(value)
    return out


def validation_pod(validator: Mapping[str, Any], assets: Path, namespace: str, component: str, node: str,
                   resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    """The workload pod the validator's `component` (cuda | plugin) init container creates on `node`, from
    validator/manifests/<component>-workload-validation.yaml in the unpacked assets, filled as
    cmd/nvidia-validator/main.go at v26.7.0 fills it (CUDA.runWorkload :1564-1626, Plugin.runWorkload
    :1300-1373): namespace = OPERATOR_NAMESPACE (the DaemonSet's, :1572/:1308); both images =
    VALIDATOR_IMAGE; pull policy, pull secrets and runtime class from VALIDATOR_IMAGE_PULL_POLICY,
    VALIDATOR_IMAGE_PULL_SECRETS, VALIDATOR_RUNTIME_CLASS when set (the operator sets them on that init
    container: controllers/object_controls.go TransformValidatorComponent); ownerReferences and tolerations
    copied from the live DaemonSet nvidia-operator-validator (:1600/:1602, :1336/:1338); nodeName = NODE_NAME
    (:1604, :1340); the plugin's init container requests and limits one `resource` (getGPUResourceName, :1342-1352).
    Its name stays the manifest's generateName. `validator` is the live DaemonSet nvidia-operator-validator,
    `assets` the unpacked operand assets (gpu_operator.unpack)."""
    manifest = "cuda-workload-validation.yaml" if component == "cuda" else "plugin-workload-validation.yaml"
    pod: dict[str, Any] = yaml.safe_load((assets / "validator" / "manifests" / manifest).read_text())
    template = validator["spec"]["template"]["spec"]
    init = next(c for c in template["initContainers"] if c["name"] == f"{component}-validation")
    env = {e["name"]: e.get("value", "") for e in init.get("env", []) if "value" in e}
    pod["metadata"]["namespace"] = namespace
    spec = pod["spec"]
    for c in (spec["containers"][0], spec["initContainers"][0]):
        c["image"] = env.get("VALIDATOR_IMAGE", "")
        if env.get("VALIDATOR_IMAGE_PULL_POLICY"):
            c["imagePullPolicy"] = env["VALIDATOR_IMAGE_PULL_POLICY"]
    if env.get("VALIDATOR_IMAGE_PULL_SECRETS"):
        spec["imagePullSecrets"] = [{"name": n} for n in env["VALIDATOR_IMAGE_PULL_SECRETS"].split(",")]
    if env.get("VALIDATOR_RUNTIME_CLASS"):
        spec["runtimeClassName"] = env["VALIDATOR_RUNTIME_CLASS"]
    pod["metadata"]["ownerReferences"] = copy.deepcopy(validator["metadata"].get("ownerReferences", []))
    spec["tolerations"] = copy.deepcopy(template.get("tolerations", []))
    spec["nodeName"] = node
    if component == "plugin":
        spec["initContainers"][0]["resources"] = {"limits": {resource: "1"}, "requests": {resource: "1"}}
    return pod
