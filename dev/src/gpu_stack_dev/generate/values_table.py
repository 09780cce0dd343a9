"""The values table of charts/gpu-stack/README.md, from values.yaml `# --` comments (`make generate`).

A `# --` comment (continued by the `#` lines right below it) documents the key on the next line.
Types come from values.schema.json (falling back to the YAML type), defaults from values.yaml.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import yaml

from gpu_stack_dev.generate.paths import CHART, with_section

SECTION = "values-table"
KEY_LINE = re.compile(r'^(?P<indent> *)(?P<key>"[^"]+"|\'[^\']+\'|[^\s#\-"\'][^:#]*?):(?:\s|$)')


@dataclass(frozen=True)
class Entry:
    path: tuple[str, ...]
    description: str
    line: int


def documented_keys(text: str) -> list[Entry]:
    """Keys with a `# --` comment, in file order, with their full paths."""
    entries: list[Entry] = []
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if pending is not None:
                pending.append(stripped[1:].strip())
            continue
        if not stripped:
            pending = None
            continue
        match = KEY_LINE.match(raw)
        if not match:  # a list item or a continuation line: part of the value above
            pending = None
            continue
        indent = len(match["indent"])
        key = match["key"].strip().strip("\"'")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        if pending is not None:
            entries.append(Entry(tuple(k for _, k in stack), " ".join(p for p in pending if p), number))
        pending = None
    return entries


def leaf_paths(values: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths of all leaves (scalars, lists and empty maps) of a values tree."""
    if isinstance(values, dict) and values:
        return [p for k, v in values.items() for p in leaf_paths(v, (*prefix, str(k)))]
    return [prefix]


def get_path(values: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        values = values[key]
    return values


def schema_at(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    """The sub-schema that governs `path`, following properties, additionalProperties and $ref."""
    node: dict[str, Any] | None = schema
    for key in path:
        node = _deref(schema, node)
        if node is None:
            return None
        if key in node.get("properties", {}):
            node = node["properties"][key]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return None
    return _deref(schema, node)


def _deref(schema: dict[str, Any], node: dict[str, Any] | None) -> dict[str, Any] | None:
    while node is not None and "$ref" in node:
        target: Any = schema
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        node = target
    return node


def type_name(schema: dict[str, Any], path: tuple[str, ...], value: Any) -> str:
    sub = schema_at(schema, path) or {}
    if "enum" in sub:
        return "enum (" + ", ".join(json.dumps(v) for v in sub["enum"]) + ")"
    if "type" in sub:
        t = sub["type"]
        name = " or ".join(t) if isinstance(t, list) else t
        if name == "array" and isinstance(sub.get("items"), dict):
            items = _deref(schema, sub["items"]) or {}
            if "enum" in items:
                return "list of enum (" + ", ".join(json.dumps(v) for v in items["enum"]) + ")"
            if "type" in items:
                return f"list of {items['type']}"
        return name
    if "oneOf" in sub or "anyOf" in sub:
        return "see schema"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), "any")


def table(values_text: str, schema: dict[str, Any]) -> str:
    values = yaml.safe_load(values_text)
    rows = ["| Key | Type | Default | Description |", "|---|---|---|---|"]
    for entry in documented_keys(values_text):
        value = get_path(values, entry.path)
        default = json.dumps(value, separators=(",", ":"), sort_keys=False)
        cell = f"`{default}`" if len(default) <= 120 else "see values.yaml"
        description = entry.description.replace("|", "\\|")
        rows.append(f"| `{'.'.join(entry.path)}` | {type_name(schema, entry.path, value)} | {cell} | {description} |")
    return "\n".join(rows) + "\n"


def readme(text: str) -> str:
    """The chart README `text` with its values table made from values.yaml and values.schema.json."""
    values_text = (CHART / "values.yaml").read_text(encoding="utf-8")
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    return with_section(text, SECTION, table(values_text, schema))
