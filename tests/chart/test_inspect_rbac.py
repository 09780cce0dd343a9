"""The read-only ClusterRole of `kubectl gpu-stack inspect` (inspect.rbac.*): exactly the reads
webhook/src/gpu_stack_webhook/kube/inspect.py makes, on by default, bound only to the subjects given."""

from __future__ import annotations

from typing import Any

import pytest

from .chartlib import FULLNAME, HELM_MAJORS, find, one, render

ROLE = f"{FULLNAME}-inspect"
CONFIGMAP = f"{FULLNAME}-device-plugin-configs"
GROUP = {"kind": "Group", "name": "gpu-users", "apiGroup": "rbac.authorization.k8s.io"}
ROBOT = {"kind": "ServiceAccount", "name": "dashboard", "namespace": "monitoring"}


@pytest.mark.parametrize("major", HELM_MAJORS)
def test_default_cluster_role_is_read_only_and_names_the_configmap(major: int) -> None:
    objects = render(major).objects()
    role = one(objects, "ClusterRole", ROLE)
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [CONFIGMAP], "verbs": ["get"]},
    ]
    assert role["metadata"]["labels"]["app.kubernetes.io/component"] == "inspect"
    one(objects, "ConfigMap", CONFIGMAP)  # the name in resourceNames is the ConfigMap the chart renders
    assert find(objects, "ClusterRoleBinding", ROLE) == []  # unbound: grants nothing


def test_device_plugin_configmap_names_the_default_config() -> None:
    cm = one(render(3, "per-node-configs.yaml").objects(), "ConfigMap", CONFIGMAP)
    assert cm["metadata"]["annotations"] == {"gpu-stack.io/default-config": "default"}
    assert sorted(cm["data"]) == ["default", "mig-mixed", "mps-x10", "ts-x4"]


def test_subjects_get_a_binding() -> None:
    objects = render(3, set_json={"inspect.rbac.subjects": [GROUP, ROBOT]}).objects()
    binding = one(objects, "ClusterRoleBinding", ROLE)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE}
    assert binding["subjects"] == [GROUP, ROBOT]


def test_create_false_renders_neither() -> None:
    objects = render(3, set_json={"inspect.rbac.create": False, "inspect.rbac.subjects": [GROUP]}).objects()
    assert find(objects, "ClusterRole", ROLE) == find(objects, "ClusterRoleBinding", ROLE) == []


@pytest.mark.parametrize("subject", [
    {"kind": "ServiceAccount", "name": "dashboard"},  # a ServiceAccount needs its namespace
    {"kind": "Group", "name": "gpu-users", "namespace": "x"},  # users and groups have none
    {"kind": "Robot", "name": "r2"},
    {"kind": "User", "name": ""},
])
def test_schema_rejects_bad_subjects(subject: dict[str, Any]) -> None:
    result = render(3, set_json={"inspect.rbac.subjects": [subject]})
    assert not result.ok
    assert "- inspect.rbac.subjects.0" in result.stderr
