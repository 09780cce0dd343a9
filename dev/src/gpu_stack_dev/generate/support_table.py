"""The support table (Kubernetes minor x feature) of docs/kubernetes-versions.md and the README, from what
tests/e2e/test_kubernetes_minors.py found on each minor (its results file, tests/e2e/kubernetes-minors.json,
which that test checks on every `make e2e`)."""

from __future__ import annotations

import json
from typing import Any

from gpu_stack_dev.generate.paths import ROOT, with_section

SECTION = "support-table"
SOURCE = "tests/e2e/kubernetes-minors.json (make e2e's results per minor)"
RESULTS = ROOT / "tests" / "e2e" / "kubernetes-minors.json"
DRA = ("dra.yaml", "dra-mps-memory-slices.yaml")
POLICY_ONLY = {
    "policy-only-gpu-operator.yaml": "policy only for the GPU Operator (`policy-only-gpu-operator.yaml`) installed "
                                     "and uninstalled",
    "policy-only-device-plugin.yaml": "policy only for the device-plugin chart (`policy-only-device-plugin.yaml`) "
                                      "installed and uninstalled",
}
# The real GPU Operator v26.7.0 running, policy only beside it (tests/e2e/test_gpu_operator_policy.py on 1.36, two of
# its cases on the older minors in tests/e2e/test_kubernetes_minors.py).
BESIDE_OPERATOR = ("policy only beside the real GPU Operator v26.7.0: its pods (the validator's among them) "
                   "admitted, its objects not borrowed")
CELLS = {"yes": "yes", "refused": "refused: `gpu-stack:` message, nothing created"}


def _cell(outcomes: list[str | None]) -> str:
    if not outcomes or any(o is None for o in outcomes):
        return "not tested"
    if len(set(outcomes)) != 1:  # some of a group: each outcome once, with how many had it
        return "; ".join(f"{outcomes.count(o)}: {CELLS.get(o or '', o or '')}" for o in sorted(set(outcomes), key=str))
    return CELLS.get(outcomes[0] or "", outcomes[0] or "")


def rows(results: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(feature, one cell per minor) in the table's order; minors sorted."""
    minors = sorted(results, key=lambda m: tuple(map(int, m.split("."))))
    got = [results[m].get("results", {}) for m in minors]
    overlays = sorted({k.removeprefix("install ") for r in got for k in r if k.startswith("install ")})
    others = [o for o in overlays if o not in DRA and o not in POLICY_ONLY]
    out: list[tuple[str, list[str]]] = [
        ("API server, kubectl, Helm", [f"{r['server']}, kubectl {r['kubectl']}, Helm {r['helm']}"
                                       for r in (results[m] for m in minors)]),
        ("defaults and every other overlay (not DRA, not policy only) installed and uninstalled",
         [_cell([r.get(f"install {o}") for o in others]) for r in got]),
        ("webhook verdicts through the API server", [_cell([r.get("webhook mode")]) for r in got]),
        ("webhook lookups (`webhook.lookups.enabled`: DRA claims where served, RuntimeClasses followed)",
         [_cell([r.get("webhook lookups")]) for r in got]),
        ("CEL validation (`webhook.validation.mode=cel`)", [_cell([r.get("CEL validation")]) for r in got]),
        ("CEL mutation (`webhook.mutation.mode=cel`)", [_cell([r.get("CEL mutation")]) for r in got]),
        ("DRA overlays (`dra.yaml`, `dra-mps-memory-slices.yaml`)", [_cell([r.get(f"install {o}") for o in DRA])
                                                                     for r in got]),
        *((label, [_cell([r.get(f"install {o}")]) for r in got]) for o, label in POLICY_ONLY.items()),
        (BESIDE_OPERATOR, [_cell([r.get("beside the GPU Operator")]) for r in got]),
        ("upgrade to the next chart version (no pod rolled)", [_cell([r.get("upgrade")]) for r in got]),
        ("`kubectl gpu-stack inspect`", [_cell([r.get("inspect")]) for r in got]),
    ]
    return out


def table() -> str:
    results = json.loads(RESULTS.read_text(encoding="utf-8"))
    minors = sorted(results, key=lambda m: tuple(map(int, m.split("."))))
    lines = ["| | " + " | ".join(f"Kubernetes {m}" for m in minors) + " |",
             "|---|" + "---|" * len(minors)]
    lines += [f"| {feature} | " + " | ".join(cells) + " |" for feature, cells in rows(results)]
    return "\n".join(lines) + "\n"


def readme(text: str) -> str:
    """A document `text` with its support table made from the e2e results."""
    return with_section(text, SECTION, table())
