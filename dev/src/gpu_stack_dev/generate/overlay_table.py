"""The overlay table of README.md, from the overlays in charts/gpu-stack/examples/ (`make generate`).

Each overlay describes itself in its first comment lines: `# Overlay: <what you get>` (required) and
`# Install first: <what the cluster must serve>` (optional).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpu_stack_dev.generate.paths import CHART, ROOT, with_section

EXAMPLES = CHART / "examples"
SECTION = "overlay-table"
FIELD = re.compile(r"^# (Overlay|Install first): (.+)$")


@dataclass(frozen=True)
class Overlay:
    name: str
    summary: str
    install_first: str


def read(path: Path) -> Overlay:
    fields: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = FIELD.match(line)
        if not match:
            break
        fields[match.group(1)] = match.group(2).strip()
    if "Overlay" not in fields:
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        raise SystemExit(f"{shown}:1: the first line must be '# Overlay: <what you get>'")
    return Overlay(path.name, fields["Overlay"], fields.get("Install first", ""))


def overlays() -> list[Overlay]:
    return [read(path) for path in sorted(EXAMPLES.glob("*.yaml"))]


def table(found: list[Overlay]) -> str:
    rows = ["| Overlay (`-f Chart-values-examples/...`) | What you get | Install first |", "|---|---|---|"]
    rows += [f"| `{o.name}` | {o.summary} | {o.install_first or '—'} |" for o in found]
    return "\n".join(rows)


def readme(text: str) -> str:
    """README.md `text` with its overlay table made from the overlays."""
    return with_section(text, SECTION, table(overlays()) + "\n")
