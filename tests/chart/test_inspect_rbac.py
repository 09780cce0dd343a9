"""The read-only ClusterRole and Role of `kubectl gpu-stack inspect` (inspect.rbac.*): exactly the reads
webhook/src/gpu_stack_webhook/gpuinspect/fetch.py makes, on by default, bound only to the subjects given. The Role
lets it list the chart's dashboard ConfigMaps and GrafanaDashboards in the dashboards' namespace only: no
cluster-wide ConfigMap read."""

from __future__ import annotations

from typing import Any

import pytest
from gpu_stack_dev.chartlib import FULLNAME, HELM_MAJORS, NAMESPACE, find, one, render, run_helm, template_args
from gpu_stack_webhook.gpuinspect.fetch import DASHBOARD_SELECTOR

ROLE = f"{FULLNAME}-inspect"
CONFIGMAP = f"{FULLNAME}-device-plugin-configs"
GROUP = {"kind": "Group", "name": "gpu-users", "apiGroup": "rbac.authorization.k8s.io"}
ROBOT = {"kind": "ServiceAccount", "name": "dashboard", "namespace": "monitoring"}
DASHBOARD_RULES = [
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]},
    {"apiGroups": ["grafana.integreatly.org"], "resources": ["grafanadashboards"], "verbs": ["list"]},
]
SELECTOR = dict(kv.split("=") for kv in DASHBOARD_SELECTOR.split(","))


@pytest.mark.parametrize("major", HELM_MAJORS)
def test_default_cluster_role_is_read_only_and_names_the_configmap(major: int) -> None:
    objects = render(major).objects()
    role = one(objects, "ClusterRole", ROLE)
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [CONFIGMAP], "verbs": ["get"]},
        # DRA devices and who holds them (read-only)
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices", "resourceclaims"], "verbs": ["get", "list"]},
    ]
    assert role["metadata"]["labels"]["app.kubernetes.io/component"] == "inspect"
    one(objects, "ConfigMap", CONFIGMAP)  # the name in resourceNames is the ConfigMap the chart renders
    assert find(objects, "ClusterRoleBinding", ROLE) == []  # unbound: grants nothing
    # Only the resourceNames-restricted get above is cluster-wide; listing ConfigMaps is the Role's, namespaced.
    assert not [r for r in role["rules"] if "configmaps" in r["resources"] and "resourceNames" not in r]


@pytest.mark.parametrize("major", HELM_MAJORS)
def test_default_role_lists_dashboards_in_the_release_namespace_only(major: int) -> None:
    objects = render(major).objects()
    role = one(objects, "Role", ROLE)
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == DASHBOARD_RULES
    assert role["metadata"]["labels"]["app.kubernetes.io/component"] == "inspect"
    assert find(objects, "RoleBinding", ROLE) == []
    assert find(objects, "ConfigMap") and not [o for o in find(objects, "ConfigMap")
                                               if o["metadata"]["labels"].get("grafana_dashboard")]  # none by default


def test_role_follows_the_dashboards_namespace_and_its_selector_finds_them() -> None:
    on = {"monitoring.dashboards.enabled": True, "monitoring.dashboards.namespace": "grafana"}
    objects = render(3, set_json={**on, "inspect.rbac.subjects": [GROUP]}).objects()
    assert one(objects, "Role", ROLE)["metadata"]["namespace"] == "grafana"
    binding = one(objects, "RoleBinding", ROLE)
    assert binding["metadata"]["namespace"] == "grafana"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE}
    assert binding["subjects"] == [GROUP]
    dashboards = [o for o in find(objects, "ConfigMap") if o["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(dashboards) == 3 and {d["metadata"]["namespace"] for d in dashboards} == {"grafana"}
    # inspect lists them by the chart's labels (gpuinspect/fetch.py DASHBOARD_SELECTOR), which they carry
    for dashboard in dashboards:
        assert {k: dashboard["metadata"]["labels"][k] for k in SELECTOR} == SELECTOR
    # A namespace set while the dashboards are off: nothing goes there, the Role stays in the release's.
    off = render(3, set_json={"monitoring.dashboards.namespace": "grafana"}).objects()
    assert one(off, "Role", ROLE)["metadata"]["namespace"] == NAMESPACE


def test_device_plugin_configmap_names_the_default_config() -> None:
    cm = one(render(3, "per-node-configs.yaml").objects(), "ConfigMap", CONFIGMAP)
    assert cm["metadata"]["annotations"] == {"gpu-stack.io/default-config": "default",
                                             # the idle alert's thresholds (test_idle_thresholds.py)
                                             "gpu-stack.io/idle-gpu-utilization-percent-below": "5",
                                             "gpu-stack.io/idle-gpu-window": "30m"}
    assert sorted(cm["data"]) == ["default", "mig-mixed", "mps-x10", "ts-x4"]


def test_subjects_get_a_binding() -> None:
    objects = render(3, set_json={"inspect.rbac.subjects": [GROUP, ROBOT]}).objects()
    binding = one(objects, "ClusterRoleBinding", ROLE)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE}
    assert binding["subjects"] == [GROUP, ROBOT]
    assert one(objects, "RoleBinding", ROLE)["subjects"] == [GROUP, ROBOT]


def test_create_false_renders_none() -> None:
    objects = render(3, set_json={"inspect.rbac.create": False, "inspect.rbac.subjects": [GROUP]}).objects()
    assert find(objects, "ClusterRole", ROLE) == find(objects, "ClusterRoleBinding", ROLE) == []
    assert find(objects, "Role", ROLE) == find(objects, "RoleBinding", ROLE) == []


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


def _inspect_line(*extra: str) -> str:
    # Helm 4 renders NOTES for a client-side dry run without a cluster.
    result = run_helm(4, ["install", "--dry-run=client", *template_args(api_versions=())[1:], *extra])
    assert result.ok, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    return next(line.strip() for line in notes.splitlines() if "kubectl gpu-stack inspect" in line)


def test_notes_print_the_inspect_command_with_the_dashboards_namespace_when_it_differs() -> None:
    plain = f"kubectl gpu-stack inspect --configmap-namespace {NAMESPACE} --configmap {CONFIGMAP}"
    assert _inspect_line() == plain
    assert _inspect_line("--set", "monitoring.dashboards.enabled=true") == plain
    assert _inspect_line("--set", "monitoring.dashboards.enabled=true", "--set",
                         "monitoring.dashboards.namespace=grafana") == f"{plain} --dashboards-namespace grafana"


def test_prometheus_proxy_is_granted_only_for_the_named_service() -> None:
    """inspect --usage asks Prometheus at /api/v1/namespaces/NS/services/NAME:PORT/proxy: the Role grants `get` on
    exactly that resource name, in that namespace, bound to the inspect subjects; nothing by default."""
    assert [o for o in render(4).objects() if o["metadata"]["name"] == f"{ROLE}-prometheus"] == []
    objects = render(4, set_json={"inspect.rbac.subjects": [GROUP],
                                  "inspect.rbac.prometheusService": "monitoring/prometheus-operated:9090"}).objects()
    role = one(objects, "Role", f"{ROLE}-prometheus")
    assert role["metadata"]["namespace"] == "monitoring"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["services/proxy"],
                              "resourceNames": ["prometheus-operated:9090"], "verbs": ["get"]}]
    binding = one(objects, "RoleBinding", f"{ROLE}-prometheus")
    assert (binding["metadata"]["namespace"], binding["subjects"]) == ("monitoring", [GROUP])
    assert binding["roleRef"]["name"] == f"{ROLE}-prometheus"


@pytest.mark.parametrize("service", ["monitoring/prometheus-operated", "prometheus-operated:9090", "Mon/p:9090"])
def test_prometheus_service_must_be_namespace_name_port(service: str) -> None:
    assert not render(4, set_json={"inspect.rbac.prometheusService": service}).ok
