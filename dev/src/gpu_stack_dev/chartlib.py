"""Shared helpers for the chart tests: real Helm 3/4 binaries, cached renders, object lookup.

Every render runs the real `helm` binary. Renders are cached per process (pytest-xdist workers each
keep their own cache), keyed by helm version, overlay, --set-json values and namespace.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from gpu_stack_dev.paths import CHART, EXAMPLES, ROOT, TEMPLATE_API_VERSIONS

RELEASE = "t"
NAMESPACE = "gpu-stack"
FULLNAME = f"{RELEASE}-gpu-stack"
HELM_MAJORS = (3, 4)


def overlays() -> list[str]:
    """"default" plus every values overlay in Chart-values-examples/ (file name)."""
    files = sorted(p.name for p in EXAMPLES.glob("*.yaml")) + sorted(p.name for p in EXAMPLES.glob("*.yml"))
    return ["default", *files]


@cache
def helm_path(major: int) -> str:
    out = subprocess.run(
        [str(ROOT / "hack" / "ensure-helm.sh"), str(major)], check=True, capture_output=True, text=True
    ).stdout.strip()
    path = out.splitlines()[-1]
    version = subprocess.run([path, "version", "--template", "{{ .Version }}"], capture_output=True, text=True,
                             check=True)
    assert version.stdout.startswith(f"v{major}."), f"{path} is not Helm {major}: {version.stdout!r}"
    return path


@dataclass(frozen=True)
class Render:
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def objects(self) -> list[dict[str, Any]]:
        """The rendered objects; a mapping with a duplicate key is an error (load_all_strict)."""
        assert self.ok, f"helm template failed:\n{self.stderr}"
        return [d for d in load_all_strict(self.stdout) if d]


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that raises on a duplicate mapping key, where PyYAML silently keeps the last one
    (the API server's decoder rejects or keeps one depending on the path: the chart must not rely on it)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                        f"found duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_all_strict(text: str) -> list[Any]:
    """Every YAML document of `text`, raising on a duplicate key in any mapping."""
    return list(yaml.load_all(text, Loader=UniqueKeyLoader))


def _overlay_args(overlay: str) -> list[str]:
    return [] if overlay == "default" else ["-f", str(EXAMPLES / overlay)]


def run_helm(major: int, args: Iterable[str], timeout: float = 120) -> Render:
    proc = subprocess.run([helm_path(major), *args], capture_output=True, text=True, timeout=timeout, check=False)
    return Render(proc.returncode, proc.stdout, proc.stderr)


def template_args(overlay: str = "default", set_json: Mapping[str, Any] | None = None, namespace: str = NAMESPACE,
                  values_files: Iterable[str] = (), api_versions: Iterable[str] = TEMPLATE_API_VERSIONS) -> list[str]:
    """`api_versions`: the --api-versions flags (default: a cluster that serves DRA, paths.TEMPLATE_API_VERSIONS)."""
    args = ["template", RELEASE, str(CHART), "--namespace", namespace, *api_versions, *_overlay_args(overlay)]
    for f in values_files:
        args += ["-f", f]
    for key, value in (set_json or {}).items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    return args


@cache
def _render_cached(major: int, overlay: str, set_json: str, namespace: str) -> Render:
    return run_helm(major, template_args(overlay, json.loads(set_json), namespace))


def render(major: int = 3, overlay: str = "default", set_json: Mapping[str, Any] | None = None,
           namespace: str = NAMESPACE) -> Render:
    """`helm template` once per (helm, overlay, values, namespace) in this process."""
    return _render_cached(major, overlay, json.dumps(set_json or {}, sort_keys=True), namespace)


def find(objects: Iterable[Mapping[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [dict(o) for o in objects if o.get("kind") == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: Iterable[Mapping[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def load_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    return values


def load_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    return schema


def overlay_values(overlay: str) -> dict[str, Any]:
    """values.yaml merged with the overlay the way Helm merges maps (lists and scalars replace)."""
    base = load_values()
    if overlay == "default":
        return base
    extra = yaml.safe_load((EXAMPLES / overlay).read_text(encoding="utf-8")) or {}

    def merge(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(a)
        for k, v in b.items():
            if v is None:
                out.pop(k, None)
            elif isinstance(v, Mapping) and isinstance(out.get(k), dict):
                out[k] = merge(out[k], v)
            else:
                out[k] = v
        return out

    return merge(base, extra)


def next_chart_version(directory: Path) -> Path:
    """A copy of the chart in `directory` as the next release would ship it: only Chart.yaml's version differs."""
    chart = directory / "gpu-stack"
    shutil.copytree(CHART, chart)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    major, minor, _ = str(meta["version"]).split(".", 2)
    meta["version"] = f"{major}.{int(minor) + 1}.0"
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    return chart
