"""A GPU failing on the real node: the chart's device plugin (the upstream k8s-device-plugin v0.20.0 binary,
Chart-values-examples/exclusive.yaml, 4 mock T4s) sees an Xid 79 that NVIDIA's mock NVML injects through the NVML
event set (gpu_stack_dev.e2e.mock_gpu.inject_failure), and what a user sees follows from the real kubelet: the
node's allocatable nvidia.com/gpu drops below its capacity, `kubectl gpu-stack inspect` says so, and the chart's
alert GPUStackGPUAllocatableBelowCapacity fires on the node's real numbers.

The plugin runs with hack/node/mock-nvml-clock.c preloaded (devicePlugin.extraEnv LD_PRELOAD; the node's
`nvidia` handler puts the mock's config directory, where it is, in the container): without it the mock never
trips the failure in the NVML session the plugin's health check waits in (the file says why).

Recovery is upstream's (internal/plugin/server.go:277 at v0.20.0, "FIXME: there is no way to recover from the
Unhealthy state"): the running plugin never reports the GPU healthy again; a new plugin process starts every
device Healthy (internal/rm/devices.go:92). So: repair the GPU, then restart the plugin's pod. On the mock a GPU
that still fails trips again in the new process (its failure injection is per process), so a restart alone does
not bring it back. The plugin's side of this is in tests/deviceplugin/test_real_plugin_health.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from gpu_stack_dev.e2e import agent_images, mock_gpu
from gpu_stack_dev.e2e.e2elib import E2ECluster

from tests.e2e.inspect_api import inspect
from tests.monitoring.promlib import ksm_node_status_series, rendered_rules, run_promtool, write_rules

from .agents import GpuRelease, gpu_release
from .standin import gpu_resources, wait_for

OVERLAY = "exclusive.yaml"
GPU = "nvidia.com/gpu"
ALERT = "GPUStackGPUAllocatableBelowCapacity"
FAILING = 1  # the mock GPU's index in the profile


@pytest.fixture(scope="module")
def t4(cluster: E2ECluster, real_node: Any) -> Iterator[GpuRelease]:
    agent_images.load(real_node)
    root = real_node.mock_driver_root
    clock = mock_gpu.clock_library(root)  # in <root>/config, which gpu_release's lay_out keeps
    env = cast(list[dict[str, str]], mock_gpu.values(root)["devicePlugin.extraEnv"])
    preload: dict[str, Any] = {"devicePlugin.extraEnv": [
        *env, {"name": "LD_PRELOAD", "value": f"{mock_gpu.CONTAINER_CONFIG_DIR}/{clock.name}"}]}
    with gpu_release(cluster, real_node, OVERLAY, "t4", **preload) as release:
        yield release


def restart_plugin(release: GpuRelease) -> None:
    """Delete the device plugin's pod; its DaemonSet makes a new one (a new plugin process), waited for Ready."""
    (old,) = release.pods("device-plugin")
    release.cluster.kubectl("delete", "pod", "-n", release.release.namespace, old["metadata"]["name"], "--wait=true")

    def ready() -> bool:
        pods = [p for p in release.pods("device-plugin") if p["metadata"]["name"] != old["metadata"]["name"]]
        return any({c["type"]: c["status"] for c in p["status"].get("conditions", [])}.get("Ready") == "True"
                   for p in pods)
    wait_for(ready, "the device plugin's new pod Ready", timeout=180)


def plugin_log(release: GpuRelease) -> str:
    (pod,) = [p for p in release.pods("device-plugin") if p["status"].get("phase") == "Running"]
    return release.cluster.kubectl("logs", "-n", release.release.namespace, pod["metadata"]["name"], "-c",
                                   "nvidia-device-plugin", check=False).stdout


def resources(release: GpuRelease) -> tuple[str | None, str | None]:
    """The node's (capacity, allocatable) of nvidia.com/gpu."""
    capacity, allocatable = gpu_resources(release.node, {GPU: ""})
    return capacity[GPU], allocatable[GPU]


def node_object(release: GpuRelease) -> dict[str, Any]:
    node: dict[str, Any] = json.loads(release.node.kubectl("get", "node", release.node.node_name, "-o",
                                                           "json").stdout)
    return node


def alert_fires(tmp_path: Path, timeline: list[tuple[dict[str, Any], int]]) -> dict[str, Any]:
    """promtool's unit test of the chart's rendered rules on the series kube-state-metrics would export from the
    node objects of `timeline` ((Node, minutes it lasted), one sample a minute: healthy, unhealthy, repaired),
    expecting the alert to fire (with its annotations as the rule words them for this node) at the end of the
    unhealthy stretch, not before its `for` ran out, and not once repaired: the file promtool ran, and its
    result."""
    spec = rendered_rules()
    rule = next(r for g in spec["groups"] for r in g["rules"] if r.get("alert") == ALERT)
    samples: dict[str, list[float]] = {}
    for node, minutes in timeline:
        for series, value in ksm_node_status_series(node).items():
            samples.setdefault(series, []).extend([value] * minutes)
    node_name = timeline[0][0]["metadata"]["name"]
    status = timeline[1][0]["status"]
    unhealthy = float(status["capacity"][GPU]) - float(status["allocatable"][GPU])
    before, during = timeline[0][1], timeline[1][1]
    labels = {"severity": rule["labels"]["severity"], "node": node_name, "resource": "nvidia_com_gpu"}
    annotations = {k: v.replace("{{ $labels.node }}", node_name).replace("{{ $labels.resource }}", "nvidia_com_gpu")
                   .replace("{{ $value }}", f"{unhealthy:g}") for k, v in rule["annotations"].items()}
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": s, "values": " ".join(f"{v:g}" for v in values)} for s, values in samples.items()],
        "alert_rule_test": [
            {"eval_time": f"{before + 5}m", "alertname": ALERT, "exp_alerts": []},
            {"eval_time": f"{before + during - 1}m", "alertname": ALERT,
             "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}]},
            {"eval_time": f"{before + during + 5}m", "alertname": ALERT, "exp_alerts": []},
        ]}]}
    write_rules(tmp_path, spec)
    (tmp_path / "health.test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    result = run_promtool("test", "rules", "health.test.yaml", cwd=tmp_path)
    return {"tests": tests, "returncode": result.returncode, "output": result.stdout + result.stderr}


def test_an_xid_79_drops_allocatable_inspect_and_the_alert_show_it_and_a_repaired_gpu_returns_on_restart(
        t4: GpuRelease, tmp_path: Path) -> None:
    count, one_less = str(t4.gpus.count), str(t4.gpus.count - 1)
    failing_uuid = t4.gpus.uuids[FAILING]
    marked = f"XidCriticalError: Xid=79 on Device={failing_uuid}; marking device as unhealthy."
    wait_for(lambda: resources(t4) == (count, count), f"{count} GPUs allocatable")
    assert marked not in plugin_log(t4)
    healthy_node = node_object(t4)

    # The GPU fails under the running plugin (the mock re-reads its overrides every second).
    mock_gpu.inject_failure(t4.gpus.root, FAILING, xid=79)
    wait_for(lambda: marked in plugin_log(t4), "the plugin marking the GPU unhealthy", timeout=120)
    wait_for(lambda: resources(t4) == (count, one_less), f"allocatable {one_less} of capacity {count}", timeout=120)
    unhealthy_node = node_object(t4)

    # kubectl gpu-stack inspect: capacity against allocatable, and the note
    kubeconfig = Path(t4.cluster.kubeconfig)
    report = inspect("-o", "json", kubeconfig=kubeconfig)
    assert report.returncode == 0, report.stderr
    (node,) = [n for n in json.loads(report.stdout)["nodes"] if n["name"] == t4.node.node_name]
    (gpu,) = [r for r in node["resources"] if r["name"] == GPU]
    assert (gpu["capacity"], gpu["allocatable"], gpu["unhealthy"]) == (t4.gpus.count, t4.gpus.count - 1, 1)
    assert f"{GPU}: 1 of {count} unhealthy; no pod holds one" in node["notes"]
    table = inspect(kubeconfig=kubeconfig)
    assert table.returncode == 0, table.stderr
    assert f"unhealthy: {GPU} 1" in table.stdout

    # The plugin's pod restarted with the GPU still failing: the new plugin starts it Healthy and marks it again.
    restart_plugin(t4)
    wait_for(lambda: marked in plugin_log(t4), "the new plugin marking the GPU unhealthy", timeout=120)
    wait_for(lambda: resources(t4) == (count, one_less), f"allocatable {one_less} again", timeout=120)

    # Repaired, then the plugin's pod restarted: every GPU allocatable again, its health check watching them.
    mock_gpu.clear_failures(t4.gpus.root)
    restart_plugin(t4)
    wait_for(lambda: resources(t4) == (count, count), f"{count} GPUs allocatable again", timeout=120)
    wait_for(lambda: "Ignoring the following XIDs for health checks" in plugin_log(t4), "the health check started")
    assert marked not in plugin_log(t4)
    repaired_node = node_object(t4)

    # The chart's alert on those three states of the node, as kube-state-metrics exports them: it fires once the
    # GPU has been out for its `for` (15m), not before, and not once it is back.
    fired = alert_fires(tmp_path, [(healthy_node, 1), (unhealthy_node, 24), (repaired_node, 15)])
    assert fired["returncode"] == 0, fired["output"]
