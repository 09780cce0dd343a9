"""The pure parts of the GPU Operator harness (gpu_stack_dev.e2e.gpu_operator; tests/e2e/test_gpu_operator_real.py
runs the operator itself): the chart's RBAC moved to another namespace, ClusterPolicy overrides, the build found
beside the checkout and refused when its binary is not the one the README pins."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest
import yaml
from gpu_stack_dev.e2e import gpu_operator
from gpu_stack_dev.e2e.gpu_operator import GpuOperatorError, merged, rbac_for, source_dir, unpack

RBAC = """
apiVersion: v1
kind: ServiceAccount
metadata: {name: gpu-operator, namespace: gpu-operator}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: gpu-operator}
subjects: [{kind: ServiceAccount, name: gpu-operator, namespace: gpu-operator}]
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: gpu-operator}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: gpu-operator, namespace: gpu-operator}
subjects: [{kind: ServiceAccount, name: gpu-operator, namespace: gpu-operator}]
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: gpu-operator}
"""


def test_rbac_moves_to_the_namespace_and_keeps_its_names() -> None:
    sa, crb, rb = rbac_for(RBAC, "nv-op")
    assert sa["metadata"] == {"name": "gpu-operator", "namespace": "nv-op"}
    assert crb["metadata"] == {"name": "gpu-operator"}  # cluster-scoped: no namespace added
    subject = {"kind": "ServiceAccount", "name": "gpu-operator", "namespace": "nv-op"}
    assert crb["subjects"] == rb["subjects"] == [subject]
    assert crb["roleRef"]["name"] == rb["roleRef"]["name"] == "gpu-operator"


def test_overrides_merge_into_the_default_spec() -> None:
    spec = yaml.safe_load(gpu_operator.CLUSTER_POLICY.read_text())["spec"]
    out = merged(spec, {"cdi": {"nriPluginEnabled": True}, "migManager": {"enabled": False}})
    assert out["cdi"] == {"enabled": True, "nriPluginEnabled": True}
    assert out["migManager"]["enabled"] is False and out["migManager"]["image"] == spec["migManager"]["image"]
    assert "nriPluginEnabled" not in spec["cdi"]  # the default is left as it was


def test_the_build_is_found_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_STACK_GPU_OPERATOR_SRC", str(tmp_path))
    assert source_dir() is None
    (tmp_path / "gpu-operator.xz").write_bytes(b"")
    assert source_dir() == tmp_path


def test_a_binary_other_than_the_pinned_one_is_refused(tmp_path: Path) -> None:
    (tmp_path / "gpu-operator.xz").write_bytes(lzma.compress(b"not the operator"))
    with pytest.raises(GpuOperatorError, match=r"unpacks to sha256 \w+, not 70b2a7be"):
        unpack(tmp_path, tmp_path / "cache")
    assert not (tmp_path / "cache" / "gpu-operator").exists()

