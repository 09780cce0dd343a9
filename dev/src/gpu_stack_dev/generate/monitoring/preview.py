"""Preview pictures of the chart's dashboards: every panel's queries evaluated against a real Prometheus and drawn
with matplotlib in the dashboard's own grid layout. A preview, not Grafana: lines, numbers, tables and text only.

tests/e2e/test_monitoring.py calls `write_previews` at the end of its run when GPU_STACK_PREVIEW_DIR is set
(`GPU_STACK_PREVIEW_DIR=docs/monitoring-previews make e2e`), with the Prometheus of that run: the pictures in
docs/monitoring-previews/ come from there.
"""

from __future__ import annotations

import json
import re
import textwrap
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Series = tuple[dict[str, str], list[tuple[float, float]]]
QueryRange = Callable[[str], list[Series]]
COLUMNS = 24
NO_DATA = "No data"


@dataclass(frozen=True)
class Drawn:
    title: str
    kind: str
    series: int


def prometheus_range(base_url: str, start: float, end: float, step: float) -> QueryRange:
    """query_range against a Prometheus HTTP API; a failed query counts as no data."""
    def run(expr: str) -> list[Series]:
        query = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
        try:
            with urllib.request.urlopen(f"{base_url}/api/v1/query_range?{query}", timeout=30) as reply:  # noqa: S310
                body = json.loads(reply.read())
        except OSError:
            return []
        return [(r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in body["data"]["result"]]
    return run


def legend(fmt: str, labels: dict[str, str]) -> str:
    if not fmt:
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip() or "value"


def draw(board: dict[str, Any], query: QueryRange, path: Path, caption: str) -> list[Drawn]:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    panels = board["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit = 0.55  # inches per grid row; 24 columns span 20 inches
    fig = plt.figure(figsize=(20, rows * unit + 1.2))
    fig.suptitle(f"PREVIEW - {board['title']}\n{caption}", fontsize=11, y=0.995)
    top = 1 - 1.0 / (rows * unit + 1.2)
    drawn = []
    for panel in panels:
        pos = panel["gridPos"]
        left, width = pos["x"] / COLUMNS, pos["w"] / COLUMNS
        height = pos["h"] / rows * top
        bottom = top - (pos["y"] + pos["h"]) / rows * top
        if panel["type"] == "row":
            fig.text(left + 0.005, bottom + height / 2, panel["title"], fontsize=12, weight="bold", va="center")
            continue
        ax = fig.add_axes((left + 0.01, bottom + 0.02 * top, width - 0.02, height - 0.06 * top))
        ax.set_title(panel["title"], fontsize=9, loc="left")
        results = [(target, s) for target in panel.get("targets", []) for s in query(target["expr"])]
        drawn.append(Drawn(panel["title"], panel["type"], len(results)))
        if panel["type"] == "text":
            ax.axis("off")
            content = re.sub(r"[*`]", "", panel["options"]["content"])
            ax.text(0, 1, textwrap.fill(content, int(width * 190)), fontsize=7, va="top", wrap=True)
            continue
        if not results:
            ax.axis("off")
            ax.text(0.5, 0.5, NO_DATA, ha="center", va="center", fontsize=11, color="grey")
            continue
        if panel["type"] == "timeseries":
            for target, (labels, points) in results:
                ax.plot([t for t, _ in points], [v for _, v in points],
                        label=legend(target.get("legendFormat", ""), labels)[:60])
            ax.tick_params(labelsize=6)
            ax.set_xticks([])
            ax.legend(fontsize=6, loc="upper left")
        elif panel["type"] == "stat":
            ax.axis("off")
            value = results[0][1][1][-1][1]
            ax.text(0.5, 0.45, f"{value:.3g}", ha="center", va="center", fontsize=22)
        else:  # table: the last value of each series, labels as columns
            ax.axis("off")
            lines = [f"{legend('', labels)[:110]}  = {points[-1][1]:.3g}" for _, (labels, points) in results[:12]]
            ax.text(0, 1, "\n".join(lines), fontsize=6, va="top", family="monospace")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=60)
    plt.close(fig)
    return drawn


def write_previews(boards: dict[str, dict[str, Any]], query: QueryRange, directory: Path,
                   caption: str) -> dict[str, list[Drawn]]:
    return {uid: draw(board, query, directory / f"{uid}.png", caption) for uid, board in sorted(boards.items())}
