"""helm lint / helm template for the defaults and every overlay with Helm 3 and Helm 4; the rendered
objects validate against the strict Kubernetes schemas of the oldest and newest supported versions."""

from __future__ import annotations

import json
import re
from typing import Any

import kubernetes_validate
import pytest
import yaml
from gpu_stack_dev.chartlib import (
    CHART,
    EXAMPLES,
    NAMESPACE,
    _overlay_args,
    load_all_strict,
    overlays,
    render,
    run_helm,
    template_args,
)

# The chart's kubeVersion floor (Chart.yaml) and the newest schema kubernetes-validate ships.
K8S_VERSIONS = ("1.32", "1.37")
# Custom resources: their CRDs are not part of Kubernetes, so no schema exists for them here.
CUSTOM_KINDS = {
    ("cert-manager.io/v1", "Certificate"),
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "ClusterIssuer"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("nfd.k8s-sigs.io/v1alpha1", "NodeFeatureRule"),
    ("nfd.k8s-sigs.io/v1alpha1", "NodeFeature"),
    ("nfd.k8s-sigs.io/v1alpha1", "NodeFeatureGroup"),
    ("grafana.integreatly.org/v1beta1", "GrafanaDashboard"),
}

OVERLAYS = overlays()
# Renders of the CEL admission policies too (templates/webhook/admission-policies.yaml): no overlay turns them on.
CEL_MODES = {"webhook.validation.mode": "both", "webhook.mutation.mode": "cel", "webhook.cel.assumeServed": True}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_lint_strict(helm: int, overlay: str) -> None:
    result = run_helm(helm, ["lint", "--strict", str(CHART), "--namespace", NAMESPACE, *_overlay_args(overlay)])
    assert result.ok, result.stdout + result.stderr
    # helm lint reports a template `fail` as a message; make sure none slipped through as INFO. helm lint takes no
    # --api-versions, so a DRA overlay meets the check that resource.k8s.io/v1 is served (and only that one).
    out = result.stdout + result.stderr
    if overlay in MIN_K8S:
        out = out.replace(DRA_NOT_SERVED, "")
    assert "gpu-stack:" not in out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_template_renders(helm: int, overlay: str) -> None:
    objects = render(helm, overlay).objects()
    assert objects, "nothing rendered"
    for obj in objects:
        assert {"apiVersion", "kind", "metadata"} <= obj.keys(), obj
        assert obj["metadata"].get("name"), obj


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_helm3_and_helm4_agree(overlay: str) -> None:
    """Same objects from both (the install order of kinds may differ between them)."""

    def key(obj: dict[str, Any]) -> tuple[str, str, str]:
        return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])

    assert sorted(render(3, overlay).objects(), key=key) == sorted(render(4, overlay).objects(), key=key)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_two_renders_are_identical(helm: int, overlay: str) -> None:
    """No genCA/randAlpha/now: the same values give byte-identical manifests (uncached renders)."""
    first = render(helm, overlay)  # the cached render
    second = run_helm(helm, template_args(overlay))  # a fresh one
    assert first.ok, first.stderr
    assert first.stdout == second.stdout


BANNED_FUNCTIONS = ("genCA", "genPrivateKey", "genSelfSignedCert", "genSignedCert", "randAlpha", "randAlphaNum",
                    "randNumeric", "randAscii", "uuidv4", "now", "lookup")


def nondeterministic_calls(template: str) -> list[str]:
    """Banned functions called in a template's actions (comments and string literals ignored)."""
    text = re.sub(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", "", template, flags=re.S)
    actions = " ".join(re.findall(r"\{\{(.*?)\}\}", text, flags=re.S))
    actions = re.sub(r'"(?:[^"\\]|\\.)*"|`[^`]*`', '""', actions)
    return [fn for fn in BANNED_FUNCTIONS if re.search(rf"(?<![\w.$]){fn}\b", actions)]


def test_nondeterministic_call_detector() -> None:
    sample = ('{{/* now */}} {{ fail "not now" }} {{ .Values.now }} {{ $now }} '
              '{{ now | date "2006" }} {{- genCA "x" 3 }}')
    assert nondeterministic_calls(sample) == ["genCA", "now"]


# validate.yaml renders no object, so what it looks up can only stop an install, never change a manifest:
# its cluster-prerequisite checks `lookup` whether Helm talks to a cluster at all (and the NFD CRD), and
# whether the RuntimeClass the GPU agents need is served.
ALLOWED_CALLS = {("validate.yaml", "lookup")}


def test_no_nondeterministic_functions_in_templates() -> None:
    offenders = [f"{path.relative_to(CHART)}: {fn}" for path in (CHART / "templates").rglob("*") if path.is_file()
                 for fn in nondeterministic_calls(path.read_text(encoding="utf-8"))
                 if (str(path.relative_to(CHART / "templates")), fn) not in ALLOWED_CALLS]
    assert offenders == []


def test_validate_yaml_renders_nothing() -> None:
    """What makes the lookup in validate.yaml harmless: it has no output but its `fail`s."""
    result = run_helm(4, [*template_args(), "--show-only", "templates/validate.yaml"])
    assert not result.ok and "could not find template templates/validate.yaml" in result.stderr, result.stderr


_VALIDATED: dict[tuple[str, str], str | None] = {}


def _validate(obj: dict[str, Any], version: str) -> None:
    """Validate once per distinct object and version in this process: the same objects recur across
    Helm versions and overlays, and each kubernetes_validate call re-reads the whole schema."""
    key = (json.dumps(obj, sort_keys=True), version)
    if key not in _VALIDATED:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
            _VALIDATED[key] = None
        except kubernetes_validate.ValidationError as exc:
            _VALIDATED[key] = str(exc)
    if _VALIDATED[key] is not None:
        name = f"{obj['kind']}/{obj['metadata'].get('name')}"
        pytest.fail(f"{name} is invalid for Kubernetes {version}: {_VALIDATED[key]}")


DRA_NOT_SERVED = "gpu-stack: dra.enabled=true needs resource.k8s.io/v1 DeviceClass (Kubernetes >= 1.34)"
# Overlays that need a newer Kubernetes than the chart's oldest: DRA (resource.k8s.io/v1) is GA since 1.34;
# validate.yaml refuses dra.enabled on a cluster that does not serve it.
MIN_K8S = {"dra.yaml": (1, 34), "dra-mps-memory-slices.yaml": (1, 34)}


def _supported(overlay: str, version: str) -> bool:
    return tuple(int(x) for x in version.split(".")) >= MIN_K8S.get(overlay, (0, 0))


@pytest.mark.parametrize(("overlay", "version"),
                         [(o, v) for o in OVERLAYS for v in K8S_VERSIONS if _supported(o, v)])
def test_objects_match_strict_kubernetes_schema(helm: int, overlay: str, version: str) -> None:
    validated = 0
    for obj in render(helm, overlay).objects():
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            continue  # no schema: a custom resource (its CustomResourceDefinition itself is validated)
        try:
            _validate(obj, version)
        except kubernetes_validate.SchemaNotFoundError:
            pytest.fail(f"no Kubernetes {version} schema for {obj['apiVersion']} {obj['kind']}: "
                        "a removed API, or a custom kind missing from CUSTOM_KINDS")
        validated += 1
    assert validated > 0


def test_custom_kinds_really_have_no_schema() -> None:
    """The skip list above is honest: kubernetes-validate has no schema for any of those kinds."""
    for api_version, kind in CUSTOM_KINDS:
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):
            kubernetes_validate.validate({"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}},
                                         K8S_VERSIONS[-1], strict=True)


def test_strict_schema_rejects_unknown_fields() -> None:
    """Guard for the validation above: strict mode must catch a misspelt field."""
    obj = render(3).objects()[0]
    broken = {**obj, "metadata": {**obj["metadata"], "lables": {}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


def _no_duplicate_keys(text: str) -> None:
    """Every mapping of every document in `text`, and of the YAML files the documents carry as ConfigMap
    data (the policy, the device plugin configs), has each key once (load_all_strict raises otherwise)."""
    for doc in load_all_strict(text):
        if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
            for key, value in (doc.get("data") or {}).items():
                if key.endswith((".yaml", ".yml")):
                    load_all_strict(value)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_mapping_has_a_duplicate_key(helm: int, overlay: str) -> None:
    """PyYAML keeps the last of two equal keys without a word, and so would a reader of the chart: every
    render (the defaults, each overlay, the CEL policies) is read with a loader that refuses them."""
    result = render(helm, overlay)
    assert result.ok, result.stderr
    _no_duplicate_keys(result.stdout)
    if overlay == "default":
        cel = render(helm, overlay, set_json=CEL_MODES)
        assert cel.ok, cel.stderr
        assert "ValidatingAdmissionPolicy" in cel.stdout and "MutatingAdmissionPolicy" in cel.stdout
        _no_duplicate_keys(cel.stdout)


def test_values_files_have_no_duplicate_key() -> None:
    for path in [CHART / "values.yaml", *sorted(EXAMPLES.glob("*.yaml"))]:
        load_all_strict(path.read_text(encoding="utf-8"))


def test_the_strict_loader_refuses_a_duplicate_key() -> None:
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key 'readOnly'"):
        load_all_strict("a:\n  - name: policy\n    readOnly: true\n    readOnly: true\n")
    assert load_all_strict("a: {b: 1}\n---\nb: [1, 1]\n") == [{"a": {"b": 1}}, {"b": [1, 1]}]
