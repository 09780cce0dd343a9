"""The RBAC section of charts/gpu-stack/README.md, from the rendered chart (every permission per
ServiceAccount, union over the defaults and every overlay in Chart-values-examples/; `make generate`).

Needs helm (hack/ensure-helm.sh provides it).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from gpu_stack_dev.generate.paths import CHART, EXAMPLES, TEMPLATE_API_VERSIONS, helm, with_section

SECTION = "rbac-table"
RELEASE, NAMESPACE = "gpu-stack", "gpu-stack"


def rendered(binary: str, overlay: Path | None) -> list[dict[str, Any]]:
    args = [binary, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *TEMPLATE_API_VERSIONS]
    if overlay:
        args += ["-f", str(overlay)]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def permissions(objects: list[dict[str, Any]]) -> dict[str, set[tuple[str, str, str, str]]]:
    """ServiceAccount -> {(scope, apiGroups, resources[/names], verbs)}."""
    roles = {(o["kind"], o["metadata"]["name"]): o for o in objects if o["kind"] in ("Role", "ClusterRole")}
    out: dict[str, set[tuple[str, str, str, str]]] = {}
    for binding in (o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        role = roles.get((binding["roleRef"]["kind"], binding["roleRef"]["name"]))
        namespace = binding["metadata"].get("namespace", NAMESPACE)
        scope = "cluster" if binding["kind"] == "ClusterRoleBinding" else f"namespace {namespace}"
        for subject in binding.get("subjects") or []:
            if subject.get("kind") != "ServiceAccount":
                continue
            rows = out.setdefault(subject["name"], set())
            for rule in (role or {}).get("rules") or []:
                groups = ",".join(g or "core" for g in rule.get("apiGroups", []))
                resources = ",".join(rule.get("resources", []))
                if rule.get("resourceNames"):
                    resources += f" ({','.join(rule['resourceNames'])})"
                rows.add((scope, groups, resources, ",".join(rule.get("verbs", []))))
    for sa in (o for o in objects if o["kind"] == "ServiceAccount"):
        out.setdefault(sa["metadata"]["name"], set())
    return out


def table() -> str:
    binary = helm()
    merged: dict[str, set[tuple[str, str, str, str]]] = {}
    for overlay in [None, *sorted(EXAMPLES.glob("*.yaml"))]:
        for sa, rows in permissions(rendered(binary, overlay)).items():
            merged.setdefault(sa, set()).update(rows)
    lines = ["", f"Release `{RELEASE}`; every permission any ServiceAccount gets with the defaults or an "
             "overlay of `Chart-values-examples/`.", "",
             "| ServiceAccount | Scope | API groups | Resources | Verbs |", "|---|---|---|---|---|"]
    for sa in sorted(merged):
        for scope, groups, resources, verbs in sorted(merged[sa]) or [("-", "-", "no RBAC", "-")]:
            lines.append(f"| `{sa}` | {scope} | {groups} | {resources} | {verbs} |")
    return "\n".join([*lines, "", ""])


def readme(text: str) -> str:
    """The chart README `text` with its RBAC section made from the rendered chart."""
    return with_section(text, SECTION, table())
