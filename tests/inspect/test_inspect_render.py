"""What `inspect` prints: the table for the 4-node cluster (exact), -o wide/json/yaml, colour rules."""

from __future__ import annotations

import io
import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from gpu_stack_dev.inspect_cluster import NODES, PODS, chart_configmap, chart_dashboards, node
from gpu_stack_webhook.gpuinspect import records as inspect_records
from gpu_stack_webhook.gpuinspect import render as inspect_render
from gpu_stack_webhook.gpuinspect.dashboards import dashboards
from gpu_stack_webhook.gpuinspect.model import build_report, sharing_from_configmap
from gpu_stack_webhook.settings import load_terminal_settings

HERE = Path(__file__).parent
SCHEMA = Path(inspect_records.__file__).with_name("inspect-v1.schema.json")
# The same two files are what the e2e tests expect from a real API server, and what README.md shows.
EXPECTED_TABLE = (HERE / "expected-4node.txt").read_text()
EXPECTED_JSON = (HERE / "expected-4node.json").read_text()


def report(**kwargs: object) -> inspect_records.Report:
    cm = chart_configmap()
    sharing = sharing_from_configmap(cm["data"], cm["metadata"]["annotations"]["gpu-stack.io/default-config"])
    kwargs.setdefault("dashboards", dashboards("gpu-stack", chart_dashboards()))
    return build_report(NODES, PODS, sharing, **kwargs)  # type: ignore[arg-type]


def test_table_exact() -> None:
    assert inspect_render.render(report(), "table") == EXPECTED_TABLE


def test_json_exact_and_valid_against_the_published_schema() -> None:
    text = inspect_render.render(report(), "json")
    assert text == EXPECTED_JSON
    jsonschema.validate(json.loads(text), json.loads(SCHEMA.read_text()))


def test_yaml_is_the_same_document() -> None:
    assert yaml.safe_load(inspect_render.render(report(), "yaml")) == json.loads(EXPECTED_JSON)


def test_wide_adds_strategy_replicas_type_and_phase_for_the_mig_node_in_one_namespace() -> None:
    wide = inspect_render.render(report(holder_namespace="vision"), "wide")
    mig_node = wide.split("\n\n")[1]
    assert mig_node == (
        "gpu-a100-mig   1x NVIDIA-A100-SXM4-40GB, 40960 MiB each\n"
        "  sharing  none, config mig-mixed (node label)\n"
        "  mig      strategy mixed, layout all-balanced (success)\n"
        "  RESOURCE                 CAPACITY   ALLOCATABLE   REQUESTED   FREE   STRATEGY    REPLICAS\n"
        "  nvidia.com/mig-1g.5gb    2          2             1           1      exclusive   1\n"
        "  nvidia.com/mig-2g.10gb   1          1             0           1      exclusive   1\n"
        "  nvidia.com/mig-3g.20gb   1          1             1           0      exclusive   1\n"
        "  POD                 CONTAINER   RESOURCE                 AMOUNT   TYPE            PHASE\n"
        "  vision/mig-medium   warmup      nvidia.com/mig-3g.20gb   1        initContainer   Pending\n"
        "  vision/mig-medium   main        nvidia.com/mig-3g.20gb   1        container       Pending"
    )
    assert wide.endswith("; 2 pods in namespace vision holding GPU resources\n")
    assert "  no pods hold GPU resources\n" in wide  # the exclusive node holds only an ml pod


def test_notes_and_empty_cluster() -> None:
    overcommitted = node("n1", {"nvidia.com/gpu.product": "Tesla-T4"}, {"nvidia.com/gpu": 0})
    text = inspect_render.render(build_report([overcommitted], [], notes=["ConfigMap x not found"]), "table")
    assert text == (
        "n1   Tesla-T4\n"
        "  sharing  unlabelled\n"
        "  RESOURCE         CAPACITY   ALLOCATABLE   REQUESTED   FREE\n"
        "  nvidia.com/gpu   0          0             0           0\n"
        "  no pods hold GPU resources\n"
        "\n"
        "note: ConfigMap x not found\n"
        "1 GPU node, 0 GPUs; free: nvidia.com/gpu 0/0; 0 pods holding GPU resources\n"
    )
    assert inspect_render.render(build_report([], []), "table") == (
        "No GPU nodes found.\n0 GPU nodes, 0 GPUs; 0 pods holding GPU resources\n")


def test_dashboards_none_installed_and_not_looked_up() -> None:
    text = inspect_render.render(report(dashboards=dashboards("gpu-stack", [])), "table")
    assert ("\nno dashboards installed in namespace gpu-stack (monitoring.dashboards.enabled=false)\n\n4 GPU nodes"
            in text)
    assert json.loads(inspect_render.render(report(dashboards=dashboards("gpu-stack", [])), "json"))["dashboards"] == {
        "namespace": "gpu-stack", "items": []}
    unread = inspect_render.render(report(dashboards=None, notes=["dashboards not looked up (forbidden)"]), "json")
    assert json.loads(unread)["dashboards"] is None
    jsonschema.validate(json.loads(unread), json.loads(SCHEMA.read_text()))


def test_grafana_operator_dashboards_and_a_custom_namespace() -> None:
    (cm, *_) = chart_dashboards()
    operator = {"apiVersion": "grafana.integreatly.org/v1beta1", "kind": "GrafanaDashboard",
                "metadata": {"name": "gpu-stack-dashboard-admission", "namespace": "grafana"},
                "spec": {"folder": "GPU", "json": cm["data"]["gpu-stack-admission.json"]}}
    cm["metadata"]["namespace"] = "grafana"
    cm["metadata"]["annotations"] = {"meta.helm.sh/release-name": "gpu-stack", "k8s-sidecar-target-directory": "/gpu"}
    found = dashboards("grafana", [cm], [operator])
    text = inspect_render.render(report(dashboards=found), "table")
    assert (
        "dashboards in namespace grafana (Grafana)\n"
        "  NAME                            KIND               FOLDER   UID                   TITLE\n"
        "  gpu-stack-dashboard-admission   ConfigMap          /gpu     gpu-stack-admission   gpu-stack / Admission\n"
        "  gpu-stack-dashboard-admission   GrafanaDashboard   GPU      gpu-stack-admission   gpu-stack / Admission\n"
    ) in text
    jsonschema.validate(json.loads(inspect_render.render(report(dashboards=found), "json")),
                        json.loads(SCHEMA.read_text()))


def test_colour_codes_wrap_padded_cells() -> None:
    text = inspect_render.render(report(), "table", color=True)
    assert "\x1b[1mgpu-a100-mig\x1b[0m   1x NVIDIA-A100-SXM4-40GB" in text
    assert "\x1b[32mstrategy mixed, layout all-balanced (success)\x1b[0m" in text
    # free 0 of 1 is yellow; the padding stays inside the cell, so columns still line up
    assert "  nvidia.com/mig-3g.20gb   1          1             1           \x1b[33m0\x1b[0m" in text
    plain = text
    for code in ("\x1b[1m", "\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[0m"):
        plain = plain.replace(code, "")
    assert plain == EXPECTED_TABLE


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("mode", "env", "tty", "expected"), [
    ("auto", {}, True, True),
    ("auto", {}, False, False),
    ("auto", {"NO_COLOR": "1"}, True, False),
    ("auto", {"TERM": "dumb"}, True, False),
    ("always", {"NO_COLOR": "1"}, False, True),
    ("never", {}, True, False),
])
def test_colour_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch, mode: str, env: dict[str, str], tty: bool,
                                   expected: bool) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    terminal = load_terminal_settings()
    assert inspect_render.color_wanted(mode, _Tty() if tty else io.StringIO(), terminal) is expected


@pytest.mark.parametrize("path", [(), ("nodes", 0), ("nodes", 0, "resources", 0), ("nodes", 0, "pods", 0),
                                  ("summary",), ("dashboards",), ("dashboards", "items", 0)])
def test_schema_rejects_unknown_fields(path: tuple[object, ...]) -> None:
    doc = json.loads(EXPECTED_JSON)
    target = doc
    for key in path:
        target = target[key]  # type: ignore[index]
    target["surprise"] = 1  # type: ignore[index]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, json.loads(SCHEMA.read_text()))


def test_the_docs_show_this_output() -> None:
    readme = (HERE.parents[1] / "docs/inspect.md").read_text()
    assert f"$ kubectl gpu-stack inspect\n{EXPECTED_TABLE}```\n" in readme
