"""values.schema.json rejects unknown keys at every level, and real Helm 3 and 4 name the key.

A misspelt key (`--set devicPlugin.enabled=true`, `timeSlicing.resources[0].replica` in an overlay)
must fail the install instead of being silently ignored.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpu_stack_dev.chartlib import CHART, HELM_MAJORS, load_schema, render, run_helm, template_args

# Objects whose keys are Kubernetes API fields the chart passes through unchanged; the API server
# rejects unknown fields there (and tests/chart/test_render.py checks the rendered objects against
# the strict Kubernetes schema).
KUBERNETES_PASS_THROUGH = {
    "valueFrom", "nodeAffinity", "podAffinity", "podAntiAffinity", "podSelector", "namespaceSelector",
    "ipBlock", "securityContext",
}
# Conditional subschemas (`if: {properties: {kind: {const: ...}}}`) test keys of an object defined beside them.
CONDITIONS = {"if", "then", "else", "not"}


def object_schemas(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        if node.get("type") == "object" or (isinstance(node.get("type"), list) and "object" in node["type"]) \
                or "properties" in node:
            yield path, node
        for key, value in node.items():
            yield from object_schemas(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from object_schemas(value, f"{path}/{i}")


def open_objects(schema: dict[str, Any]) -> list[str]:
    """Paths of object schemas that accept any key: no additionalProperties (false or a schema)."""
    return [path for path, node in object_schemas(schema)
            if "additionalProperties" not in node
            and path.rsplit("/", 1)[-1] not in KUBERNETES_PASS_THROUGH | CONDITIONS]


def test_every_object_of_the_schema_is_closed() -> None:
    assert open_objects(load_schema()) == []


def test_open_object_detector_detects() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}
    assert open_objects(schema) == ["", "/properties/a"]


def test_global_is_open_to_parent_charts_and_the_rest_closed() -> None:
    schema = load_schema()
    assert schema["additionalProperties"] is False
    assert schema["properties"]["global"]["additionalProperties"] is True


def parent_chart(tmp_path: Path) -> Path:
    """An umbrella chart with gpu-stack as its dependency and global values of its own."""
    parent = tmp_path / "platform"
    shutil.copytree(CHART, parent / "charts" / "gpu-stack")
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: platform\nversion: 1.0.0\n"
        "dependencies:\n  - name: gpu-stack\n    version: 0.1.0\n", encoding="utf-8")
    (parent / "values.yaml").write_text(
        "global:\n  imageRegistry: registry.example.com\n  storageClass: fast\n"
        "  imagePullSecrets: [{name: regcred}]\n", encoding="utf-8")
    return parent


@pytest.mark.parametrize("helm", HELM_MAJORS)
def test_a_parent_chart_with_its_own_globals_renders(helm: int, tmp_path: Path) -> None:
    parent = parent_chart(tmp_path)
    rendered = run_helm(helm, ["template", "platform", str(parent), "--namespace", "gpu-stack"])
    assert rendered.ok, rendered.stderr
    daemonsets = [o for o in rendered.objects() if o["kind"] == "DaemonSet"]
    assert daemonsets
    assert all(d["spec"]["template"]["spec"].get("imagePullSecrets") == [{"name": "regcred"}] for d in daemonsets)


@pytest.mark.parametrize("helm", HELM_MAJORS)
def test_global_image_pull_secrets_keep_their_type(helm: int) -> None:
    failed = run_helm(helm, template_args(set_json={"global": {"imagePullSecrets": "regcred"}}))
    assert not failed.ok
    assert "imagePullSecrets" in failed.stderr, failed.stderr


MISSPELT = [
    pytest.param({"devicPlugin": {"enabled": True}}, "devicPlugin", id="top-level"),
    pytest.param({"devicePlugin": {"enabeld": True}}, "enabeld", id="devicePlugin"),
    pytest.param({"gfd": {"affinity": {"nodeAfinity": {}}}}, "nodeAfinity", id="affinity"),
    pytest.param({"devicePlugin": {"extraEnv": [{"name": "A", "valeu": "1"}]}}, "valeu", id="env-item"),
    pytest.param({"toolkit": {"imagePullSecrets": [{"name": "a", "nmae": "b"}]}}, "nmae", id="pull-secret"),
    pytest.param({"webhook": {"tolerations": [{"key": "a", "operater": "Exists"}]}}, "operater",
                 id="webhook-tolerations"),
    pytest.param({"webhook": {"resources": {"limit": {"cpu": "1"}}}}, "limit", id="webhook-resources"),
    pytest.param({"webhook": {"networkPolicy": {"from": [{"podSelectors": {}}]}}}, "podSelectors", id="netpol-peer"),
    pytest.param({"sharing": {"configs": {"ts": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 2, "replica": 4}]}}}}}, "replica", id="sharing-resource"),
    pytest.param({"migManager": {"extraConfigs": {"c": [{"devices": "all", "mig-enabled": True, "mig-device": {}}]}}},
                 "mig-device", id="mig-parted-config"),
]


@pytest.mark.parametrize("helm", HELM_MAJORS)
@pytest.mark.parametrize(("values", "key"), MISSPELT)
def test_helm_rejects_a_misspelt_key_and_names_it(helm: int, values: dict[str, Any], key: str) -> None:
    r = render(helm, set_json=values)
    assert not r.ok
    assert "schema" in r.stderr
    # Helm 3: "Additional property devicPlugin is not allowed";
    # Helm 4: "additional properties 'devicPlugin' not allowed".
    named = f"property {key} is not allowed" in r.stderr or f"additional properties '{key}' not allowed" in r.stderr
    assert named, r.stderr


@pytest.mark.parametrize("helm", HELM_MAJORS)
def test_set_flag_with_a_misspelt_component(helm: int) -> None:
    """What a user types: `helm template ... --set devicPlugin.enabled=true`."""
    r = run_helm(helm, [*template_args(), "--set", "devicPlugin.enabled=true"])
    assert not r.ok
    assert "devicPlugin" in r.stderr and "not allowed" in r.stderr, r.stderr
