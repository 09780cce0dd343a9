"""Which pods an upgrade restarts: a pod template changes only when what its pods run or read changes.

Kubernetes rolls a DaemonSet or Deployment whenever `spec.template` differs, so a chart release that
only bumps the chart version must leave every pod template identical (no `helm.sh/chart` or version
label on pods), and a config change must restart exactly the pods that consume that ConfigMap
(checksum annotations of the ConfigMap data, not of its labels).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_dev.chartlib import CHART, HELM_MAJORS, next_chart_version, overlays, run_helm, template_args

WORKLOADS = {"DaemonSet", "Deployment", "StatefulSet", "Job", "CronJob"}


def pod_templates(objects: list[dict[str, Any]]) -> dict[str, str]:
    """name -> canonical JSON of spec.template of every workload (what the controller compares)."""
    out = {}
    for o in objects:
        if o.get("kind") in WORKLOADS:
            template = o["spec"]["jobTemplate"]["spec"]["template"] if o["kind"] == "CronJob" else o["spec"]["template"]
            out[f'{o["kind"]}/{o["metadata"]["name"]}'] = json.dumps(template, sort_keys=True)
    return out


def render_objects(major: int, overlay: str, chart: Path = CHART, set_json: dict[str, Any] | None = None,
                   ) -> list[dict[str, Any]]:
    args = template_args(overlay, set_json)
    args[2] = str(chart)
    r = run_helm(major, args)
    assert r.ok, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


@pytest.fixture(scope="module")
def next_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return next_chart_version(tmp_path_factory.mktemp("next"))


def changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    assert before.keys() == after.keys()
    return {name for name in before if before[name] != after[name]}


@pytest.mark.parametrize("helm", HELM_MAJORS)
@pytest.mark.parametrize("overlay", overlays())
def test_upgrade_with_an_unrelated_change_restarts_no_pod(helm: int, overlay: str, next_release: Path) -> None:
    before = pod_templates(render_objects(helm, overlay))
    # The webhook's timeout lives in the webhook configurations, in no pod.
    after = pod_templates(render_objects(helm, overlay, next_release, {"webhook.timeoutSeconds": 7}))
    assert before, "no workload rendered"
    assert changed(before, after) == set()


def test_the_upgrade_test_sees_the_chart_version(next_release: Path) -> None:
    """The copy really is another release: its non-pod objects carry the new helm.sh/chart label."""
    new = yaml.safe_load((next_release / "Chart.yaml").read_text())["version"]
    objs = render_objects(4, "default", next_release)
    assert {o["metadata"]["labels"]["helm.sh/chart"] for o in objs if o["kind"] == "ConfigMap"} == {f"gpu-stack-{new}"}


@pytest.mark.parametrize("overlay", overlays())
def test_pod_templates_carry_no_release_bound_labels(overlay: str) -> None:
    for o in render_objects(3, overlay):
        if o["kind"] in WORKLOADS:
            labels = o["spec"]["template"]["metadata"]["labels"]
            assert "helm.sh/chart" not in labels, o["metadata"]["name"]
            assert "app.kubernetes.io/version" not in labels, o["metadata"]["name"]
            assert o["spec"]["selector"]["matchLabels"].items() <= labels.items()


def _name(component: str) -> str:
    return f"t-gpu-stack-{component}"


DS = "DaemonSet/"
# (overlay, value change, the pod templates that consume the changed ConfigMap)
CONFIG_CHANGES = [
    pytest.param("default", {"sharing.configs": {"default": {}, "ts": {"timeSlicing": {
        "resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}},
        {DS + _name("device-plugin"), DS + _name("gpu-feature-discovery"), "Deployment/" + _name("webhook")},
        id="sharing-configs"),
    pytest.param("default", {"nfd.worker.sleepInterval": "120s"}, {DS + _name("nfd-worker")}, id="nfd-worker-conf"),
    pytest.param("default", {"dcgmExporter.metrics": "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization.\n"},
                 {DS + _name("dcgm-exporter")}, id="dcgm-metrics"),
    pytest.param("default", {"webhook.policy.rules.migUnexposed": "warn"}, {"Deployment/" + _name("webhook")},
                 id="webhook-policy"),
    pytest.param("mig-mixed-all-balanced.yaml",
                 {"migManager.extraConfigs": {"custom": [{"devices": "all", "mig-enabled": False}]}},
                 {DS + _name("mig-manager")}, id="mig-parted-config"),
    pytest.param("mig-mixed-all-balanced.yaml", {"migManager.hostGpuClients": ["nvsm.service"]},
                 {DS + _name("mig-manager")}, id="mig-host-clients"),
    pytest.param("mps-x10.yaml", {"sharing.configs.mps-x10.mps.resources": [{"name": "nvidia.com/gpu", "replicas": 4}]},
                 {DS + _name("device-plugin"), DS + _name("gpu-feature-discovery"), DS + _name("mps-control-daemon"),
                  "Deployment/" + _name("webhook")}, id="mps-replicas"),
]


@pytest.mark.parametrize("helm", HELM_MAJORS)
@pytest.mark.parametrize(("overlay", "change", "consumers"), CONFIG_CHANGES)
def test_a_config_change_restarts_exactly_its_consumers(helm: int, overlay: str, change: dict[str, Any],
                                                        consumers: set[str]) -> None:
    before_objs = render_objects(helm, overlay)
    after_objs = render_objects(helm, overlay, set_json=change)
    before, after = pod_templates(before_objs), pod_templates(after_objs)
    assert changed(before, after) == consumers
    # ... and through the checksum annotation alone: the pod spec itself is the same.
    for name in consumers:
        b, a = json.loads(before[name]), json.loads(after[name])
        assert b["spec"] == a["spec"], name
        assert b["metadata"]["annotations"] != a["metadata"]["annotations"], name
