"""values.yaml hygiene: every value is documented (`# --`), typed in values.schema.json, used by some
template, and listed in the README values table (generated: tests/test_generated.py)."""

from __future__ import annotations

import copy
import json
import os
import re
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import pytest
import yaml
from gpu_stack_dev.chartlib import ROOT, load_schema, load_values, run_helm, template_args
from gpu_stack_dev.generate import values_table as table_gen

Path = tuple[str, ...]
VALUES = load_values()
SCHEMA = load_schema()
LEAVES: list[Path] = table_gen.leaf_paths(VALUES)
PEM_1 = "-----BEGIN CERTIFICATE-----\nQUFBQQ==\n-----END CERTIFICATE-----"
PEM_2 = "-----BEGIN CERTIFICATE-----\nQkJCQg==\n-----END CERTIFICATE-----"

# Values that only matter when another value is set: their check renders on top of this context
# (matched by path prefix, longest last).
_NO_AGENTS = {k: {"enabled": False} for k in ("nfd", "toolkit", "devicePlugin", "gfd", "mpsControlDaemon",
                                               "dcgmExporter")}
CONTEXTS: dict[str, dict[str, Any]] = {
    "monitoring.agents": {"monitoring": {"prometheusRule": {"enabled": True}}},
    "webhook.policySource.interval": {**_NO_AGENTS, "webhook": {"policySource": {"mode": "gpu-operator"}}},
    "webhook.policySource.keepLastGoodRead": {**_NO_AGENTS, "webhook": {"policySource": {"mode": "gpu-operator"}}},
    "webhook.policySource.gpuOperator": {**_NO_AGENTS, "webhook": {"policySource": {"mode": "gpu-operator"}}},
    "webhook.policySource.devicePlugin": {**_NO_AGENTS, "webhook": {"policySource": {"mode": "device-plugin",
        "devicePlugin": {"namespace": "plugins", "configMap": "configs"}}}},
    "webhook.tls.caBundle": {"webhook": {"tls": {"mode": "secret", "caBundle": PEM_1}}},
    "certManager": {"webhook": {"tls": {"mode": "cert-manager"}}},
    "migManager": {"migManager": {"enabled": True}, "sharing": {"configs": {"default": {"migStrategy": "single"}}}},
    "dcgmExporter.serviceMonitor": {"dcgmExporter": {"serviceMonitor": {"enabled": True}}},
    "webhook.networkPolicy.from": {"webhook": {"networkPolicy": {"enabled": True}}},
    "webhook.validation.celActions": {"webhook": {"validation": {"mode": "both"}, "cel": {"assumeServed": True}}},
    "webhook.cel.assumeServed": {"webhook": {"validation": {"mode": "both"}, "cel": {"assumeServed": True}}},
    # The denial test (and its kubectl image) is rendered only with a namespace the webhook covers.
    "webhook.helmTests.kubectlImage": {"webhook": {"helmTests": {"namespace": "gpu-check"}}},
    "mpsControlDaemon": {"sharing": {"configs": {"mps-x4": {"mps": {
        "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}}},
    "gpuNodes.priorityQuota.pods": {"gpuNodes": {"priorityQuota": {"create": True}}},
    "gpuNodes.runtimeClassExists": {"toolkit": {"enabled": False}, "gpuNodes": {"runtimeClassExists": True}},
    "driver": {"driver": {"enabled": True}},
    "dra": {"dra": {"enabled": True}},
    "monitoring.webhookServiceMonitor": {"monitoring": {"webhookServiceMonitor": {"enabled": True}}},
    "monitoring.prometheusRule": {"monitoring": {"prometheusRule": {"enabled": True}}},
    "monitoring.idleGpu": {"monitoring": {"prometheusRule": {"enabled": True}, "dashboards": {"enabled": True}}},
    "monitoring.jobs": {"monitoring": {"prometheusRule": {"enabled": True}}},
    "monitoring.dashboards": {"monitoring": {"dashboards": {"enabled": True}}},
    "monitoring.dashboards.grafanaOperator": {"monitoring": {"dashboards": {"enabled": True,
                                                                            "grafanaOperator": {"enabled": True}}}},
}
# Replacement values for leaves the generic mutation cannot invent (an item for an empty list of objects).
EXAMPLES: dict[str, Any] = {
    "imagePullSecrets": [{"name": "regcred"}],
    "tolerations": [{"key": "example", "operator": "Exists", "effect": "NoSchedule"}],
    "extraEnv": [{"name": "EXAMPLE", "value": "1"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "example.com/gpu", "operator": "Exists"}]}]}}},
    "migManager.extraConfigs": {"example": [{"devices": "all", "mig-enabled": False}]},
    "webhook.rbac.extraRules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
    "webhook.rbac.extraClusterRules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}],
    "inspect.rbac.subjects": [{"kind": "Group", "name": "gpu-users", "apiGroup": "rbac.authorization.k8s.io"}],
    "inspect.rbac.prometheusService": "monitoring/prometheus-operated:9090",
    "webhook.networkPolicy.from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
    "monitoring.prometheusRule.webhookLatencyRatio": 0.8,
    "dra.featureGates": {"MPSSupport": True},
    # "" follows failurePolicy (Fail: deny), so "deny" alone changes nothing
    "webhook.policy.dra.unresolvedClaims": "warn",
    "webhook.policySource.interval": "5s",
    "webhook.policySource.keepLastGoodRead": "30s",
    "webhook.image.digest": "sha256:" + "0" * 64,
}


def dotted(path: Path) -> str:
    return ".".join(path)


def nest(path: Path, value: Any) -> dict[str, Any]:
    out: Any = value
    for key in reversed(path):
        out = {key: out}
    return out


def merge(a: Any, b: Any) -> Any:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out = dict(a)
        for k, v in b.items():
            out[k] = merge(a.get(k), v) if k in a else copy.deepcopy(v)
        return out
    return copy.deepcopy(b)


def context_for(path: Path) -> dict[str, Any]:
    ctx: dict[str, Any] = {}
    name = dotted(path)
    for prefix in sorted(CONTEXTS, key=len):
        if name == prefix or name.startswith(prefix + "."):
            ctx = merge(ctx, CONTEXTS[prefix])
    return ctx


def _accepts(schema: Mapping[str, Any] | None, value: Any) -> bool:
    """A light check of a candidate against the leaf's own schema (enum/type/pattern/bounds)."""
    if not schema:
        return True
    for combinator in ("oneOf", "anyOf"):
        if combinator in schema:
            branches = [table_gen._deref(SCHEMA, b) for b in schema[combinator]]
            return any(_accepts(b, value) for b in branches)
    if "enum" in schema:
        return value in schema["enum"]
    t = schema.get("type")
    types = t if isinstance(t, list) else [t] if t else []
    pytypes = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict}
    if types and not any(isinstance(value, pytypes[x]) and not (x in ("integer", "number") and isinstance(value, bool))
                         for x in types):
        return False
    if isinstance(value, str) and (
            ("pattern" in schema and not re.search(schema["pattern"], value))
            or len(value) < schema.get("minLength", 0)):
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not (
            schema.get("minimum", float("-inf")) <= value <= schema.get("maximum", float("inf"))):
        return False
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            return False
        if schema.get("uniqueItems") and len({json.dumps(v, sort_keys=True) for v in value}) != len(value):
            return False
    return not (isinstance(value, dict) and schema.get("additionalProperties") is False
                and not set(value) <= set(schema.get("properties", {})))


def mutations(path: Path, value: Any) -> list[Any]:
    """Candidate replacement values for a leaf, most natural first."""
    name = dotted(path)
    for key in (name, path[-1]):
        if key in EXAMPLES and EXAMPLES[key] != value:
            return [EXAMPLES[key]]
    sub = table_gen.schema_at(SCHEMA, path) or {}
    if "enum" in sub:
        return [v for v in sub["enum"] if v != value]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1]
    if isinstance(value, float):
        return [value * 2 + 1]
    if isinstance(value, str):
        return [value + "x" if value else "x", value + "1", "x1", "1h", "2h", PEM_2, "example-1", "/example",
                True, False]
    if isinstance(value, list):
        items = table_gen._deref(SCHEMA, sub.get("items")) if isinstance(sub.get("items"), dict) else {}
        out: list[Any] = []
        if value:
            out += [value[:-1], value[:1] * 2 if len(value) == 1 else value[::-1]]
        if items and "enum" in items:
            out += [[v] for v in items["enum"] if [v] != value]
        out += [[*value, c] for c in ("x", "example-1", "EXAMPLE", 1)]
        return [c for c in out if c != value]
    if isinstance(value, dict):  # an empty map
        return [{"example.com/key": "value"}, {"example": 1}, {"limits": {"cpu": "1"}}]
    return []


def pick_mutation(path: Path, current: Any) -> Any:
    sub = table_gen.schema_at(SCHEMA, path)
    for candidate in mutations(path, current):
        if _accepts(sub, candidate):
            return candidate
    raise AssertionError(f"no schema-valid replacement for {dotted(path)}={current!r}: add one to EXAMPLES")


def render_with(overrides: Mapping[str, Any], *flags: str) -> tuple[bool, str]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(dict(overrides), f)
    try:
        result = run_helm(3, [*template_args(values_files=[f.name]), *flags])
    finally:
        os.unlink(f.name)
    return result.ok, result.stdout if result.ok else result.stderr


_BASELINES: dict[str, tuple[bool, str]] = {}


def baseline(ctx: Mapping[str, Any]) -> tuple[bool, str]:
    key = json.dumps(ctx, sort_keys=True)
    if key not in _BASELINES:
        _BASELINES[key] = render_with(ctx)
    return _BASELINES[key]


def used(path: Path) -> tuple[bool, str]:
    """Does changing this leaf change the chart's output (or trip a gpu-stack check)?"""
    ctx = context_for(path)
    current = table_gen.get_path(merge(VALUES, ctx), path)
    replacement = pick_mutation(path, current)
    ok_base, base = baseline(ctx)
    assert ok_base, f"context of {dotted(path)} does not render: {base}"
    ok, out = render_with(merge(ctx, nest(path, replacement)))
    if not ok:
        # A render-time check read the value: it is used. A schema error means the mutation was bad.
        return "gpu-stack: " in out, f"{dotted(path)}={replacement!r}: {out.strip()[-300:]}"
    return out != base, f"{dotted(path)}={replacement!r} leaves the output unchanged"


SECTIONS = sorted({p[0] for p in LEAVES})


@pytest.mark.parametrize("section", SECTIONS)
def test_every_value_is_used_by_a_template(section: str) -> None:
    leaves = [p for p in LEAVES if p[0] == section]
    for ctx in {json.dumps(context_for(p), sort_keys=True) for p in leaves}:
        baseline(json.loads(ctx))  # once per context, before the threads
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(used, leaves))
    assert [msg for ok, msg in results if not ok] == []


def test_unused_value_detector_detects() -> None:
    """The check above can fail: a value no template reads leaves the output unchanged (the strict
    schema rejects such a key, hence --skip-schema-validation here)."""
    ok_base, base = render_with({})
    ok, out = render_with({"notAValueOfTheChart": "x"}, "--skip-schema-validation")
    assert ok_base and ok and out == base


def test_mutation_respects_the_schema() -> None:
    assert pick_mutation(("webhook", "failurePolicy"), "Fail") == "Ignore"
    assert pick_mutation(("webhook", "timeoutSeconds"), 30) == 29
    assert pick_mutation(("webhook", "tls", "caBundle"), "") == PEM_2
    assert pick_mutation(("webhook", "policy", "rules", "disabled"), []) == [["GPU001"]][0]


def test_every_value_is_documented() -> None:
    documented = {e.path for e in table_gen.documented_keys((ROOT / "charts/gpu-stack/values.yaml").read_text())}
    undocumented = [dotted(p) for p in LEAVES if not any(p[:i] in documented for i in range(1, len(p) + 1))]
    assert undocumented == []


def _free_form(node: Mapping[str, Any] | None) -> bool:
    return bool(node) and node.get("type") == "object" and "properties" not in node and not isinstance(
        node.get("additionalProperties"), dict) and node.get("additionalProperties") is not False


def test_every_value_is_typed_in_the_schema() -> None:
    untyped = []
    for path in LEAVES:
        if any(_free_form(table_gen.schema_at(SCHEMA, path[:i])) for i in range(1, len(path))):
            continue  # inside a free-form map (resources, affinity, ...), typed as a whole
        sub = table_gen.schema_at(SCHEMA, path)
        if not sub or not ({"type", "enum", "oneOf", "anyOf", "const"} & sub.keys()):
            untyped.append(dotted(path))
    assert untyped == []


def test_defaults_satisfy_the_schema() -> None:
    jsonschema.Draft7Validator(SCHEMA).validate(VALUES)


def test_readme_table_lists_every_documented_key() -> None:
    values_text = (ROOT / "charts/gpu-stack/values.yaml").read_text(encoding="utf-8")
    text = table_gen.table(values_text, SCHEMA)
    for entry in table_gen.documented_keys(values_text):
        assert f"| `{dotted(entry.path)}` |" in text
    assert "| `webhook.policy.mps.injectHostIPC` | boolean | `true` |" in text
