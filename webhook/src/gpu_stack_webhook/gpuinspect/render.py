"""How `gpu-stack-webhook inspect` prints a `records.Report`: a table per node and a cluster
summary line (`-o wide` adds columns), or the versioned document as JSON or YAML.

Colour (ANSI) only when asked for, which `color_wanted` decides as kubectl-style tools do: on a terminal
unless NO_COLOR is set (https://no-color.org) or TERM is dumb. JSON and YAML are never coloured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO

import orjson
import yaml

from gpu_stack_webhook.gpuinspect.records import Dashboards, NodeRecord, Report, ResourceUse
from gpu_stack_webhook.gpuinspect.usage import Figures, Usage
from gpu_stack_webhook.settings import TerminalSettings

OUTPUTS = ("table", "wide", "json", "yaml")
GAP = "   "  # between columns, as kubectl prints them
BOLD, RED, YELLOW, GREEN, RESET = "\x1b[1m", "\x1b[31m", "\x1b[33m", "\x1b[32m", "\x1b[0m"


def color_wanted(mode: str, stream: IO[str], terminal: TerminalSettings) -> bool:
    if mode == "always":
        return True
    if mode == "never" or terminal.no_color or terminal.term == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class _Paint:
    def __init__(self, on: bool) -> None:
        self.on = on

    def __call__(self, text: str, code: str) -> str:
        return f"{code}{text}{RESET}" if self.on and code else text


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], paint: _Paint,
           colors: Sequence[Sequence[str]] | None = None, indent: str = "  ") -> list[str]:
    """Columns padded to their widest cell (colour codes added after padding, so they never shift)."""
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = []
    for index, row in enumerate((header, *rows)):
        cells = []
        for col, cell in enumerate(row):
            padded = cell if col == len(row) - 1 else cell.ljust(widths[col])
            code = colors[index - 1][col] if colors and index else ""
            cells.append(paint(padded, code))
        lines.append((indent + GAP.join(cells)).rstrip())
    return lines


def _opt(value: object, none: str = "-") -> str:
    return none if value is None else str(value)


def _gpu_line(node: NodeRecord) -> str:
    text = node.product or "unknown GPU"
    if node.gpu_count is not None:
        text = f"{node.gpu_count}x {text}"
    if node.memory_mib is not None:
        text += f", {node.memory_mib} MiB each"
    return text


def _sharing_line(node: NodeRecord) -> str:
    text = node.sharing_strategy or "unlabelled"
    if node.replicas is not None and node.replicas > 1:
        text += f" x{node.replicas}"
    if node.config is not None:
        source = "node label" if node.config_label is not None else "default"
        text += f", config {node.config} ({source})"
    elif node.config_label is not None:
        text += f", config label {node.config_label}"
    return text


def _mig_line(node: NodeRecord) -> str | None:
    if node.mig_config is None and node.mig_strategy in (None, "none"):
        return None
    text = f"strategy {_opt(node.mig_strategy)}"
    if node.mig_config is not None:
        text += f", layout {node.mig_config} ({_opt(node.mig_state, 'no state')})"
    return text


def _mps_line(node: NodeRecord) -> str | None:
    limits = [f"{r.name}: {_opt(r.mps.memory_mib, '?')} MiB, {r.mps.active_thread_percentage}% of threads"
              for r in node.resources if r.mps is not None]
    return "; ".join(limits) + " per client" if limits else None


_SHORT = {"initContainer": "init", "sidecar": "sidecar"}


def _free_color(res: ResourceUse) -> str:
    if res.free < 0:
        return RED
    return YELLOW if res.free == 0 and res.allocatable else GREEN


def _state_color(state: str | None) -> str:
    return {"success": GREEN, "failed": RED}.get(state or "", YELLOW)


def render_node(node: NodeRecord, wide: bool, paint: _Paint) -> list[str]:
    lines = [f"{paint(node.name, BOLD)}   {_gpu_line(node)}", f"  sharing  {_sharing_line(node)}"]
    mig = _mig_line(node)
    if mig is not None:
        state_code = _state_color(node.mig_state) if node.mig_config is not None else ""
        lines.append(f"  mig      {paint(mig, state_code)}")
    mps = _mps_line(node)
    if mps is not None:
        lines.append(f"  mps      {mps}")
    header = ["RESOURCE", "CAPACITY", "ALLOCATABLE", "REQUESTED", "FREE"]
    if wide:
        header += ["STRATEGY", "REPLICAS"]
    rows, colors = [], []
    for res in node.resources:
        row = [res.name, str(res.capacity), str(res.allocatable), str(res.requested), str(res.free)]
        if wide:
            row += [_opt(res.strategy), _opt(res.replicas)]
        rows.append(row)
        colors.append(["", "", "", "", _free_color(res), "", ""])
    lines += _table(header, rows, paint, colors) if rows else ["  no GPU resources advertised"]
    if node.holders:
        header = ["POD", "CONTAINER", "RESOURCE", "AMOUNT"] + (["TYPE", "PHASE"] if wide else [])
        rows = []
        for h in node.holders:
            container = h.container
            if not wide and h.container_type != "container":
                container += f" ({_SHORT[h.container_type]})"
            row = [f"{h.namespace}/{h.pod}", container, h.resource, str(h.amount)]
            rows.append(row + ([h.container_type, h.phase] if wide else []))
        lines += _table(header, rows, paint)
    else:
        lines.append("  no pods hold GPU resources")
    if node.dra:
        rows = [[d.name, d.driver, d.pool, _opt(d.type), _opt(d.product), _opt(d.claim, "free"),
                 ", ".join(d.pods) or "-"] for d in node.dra]
        colors = [["", "", "", "", "", "" if d.allocated else GREEN, ""] for d in node.dra]
        lines += _table(["DRA DEVICE", "DRIVER", "POOL", "TYPE", "PRODUCT", "CLAIM", "PODS"], rows, paint, colors)
    lines += [f"  {paint('note', YELLOW)}: {note}" for note in node.notes]
    return lines


def render_dashboards(dashboards: Dashboards, paint: _Paint) -> list[str]:
    if not dashboards.items:
        return [f"no dashboards installed in namespace {dashboards.namespace} (monitoring.dashboards.enabled=false)"]
    rows = [[d.name if d.namespace == dashboards.namespace else f"{d.namespace}/{d.name}", d.kind,
             _opt(d.folder), _opt(d.uid), _opt(d.title)] for d in dashboards.items]
    return [f"{paint('dashboards', BOLD)} in namespace {dashboards.namespace} (Grafana)",
            *_table(["NAME", "KIND", "FOLDER", "UID", "TITLE"], rows, paint)]


def summary_line(report: Report) -> str:
    nodes = len(report.nodes)
    text = f"{nodes} GPU node{'s' if nodes != 1 else ''}, {report.gpus} GPU{'s' if report.gpus != 1 else ''}"
    if report.totals:
        text += "; free: " + ", ".join(f"{r.name} {r.free}/{r.allocatable}" for r in report.totals)
    unhealthy = [r for r in report.totals if r.unhealthy]
    if unhealthy:
        text += "; unhealthy: " + ", ".join(f"{r.name} {r.unhealthy}" for r in unhealthy)
    published, allocated = report.dra_devices
    if published:
        text += f"; DRA devices free: {published - allocated}/{published}"
    pods = report.holding_pods
    where = f" in namespace {report.holder_namespace}" if report.holder_namespace is not None else ""
    return text + f"; {pods} pod{'s' if pods != 1 else ''}{where} holding GPU resources"


def _num(value: float) -> str:
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def _pair(f: Figures | None) -> tuple[str, str]:
    return ("-", "-") if f is None else (_num(f.mean), _num(f.max))


_FIGURES = {"per-pod": "per pod", "device-level": "shared, device-level", "none": "no series"}


def _hours(value: float) -> str:
    return f"{value:.2f}" if value >= 0.01 else f"{value:.4f}"


def _gpus(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def render_usage(usage: Usage, show_usage: bool, show_idle: bool, paint: _Paint) -> list[str]:
    """The holders' use over the window (--usage) and the idle ones, most GPU-hours first (--idle)."""
    title = f"the last {usage.window}, Prometheus at {usage.where}" if usage.where else f"the last {usage.window}"
    if usage.error is not None:
        return [f"{paint('usage', BOLD)} over {title}: not shown: {paint(usage.error, RED)}", ""]
    lines: list[str] = []
    if show_usage:
        lines.append(f"{paint('usage', BOLD)} over {title}")
        rows = [[f"{h.namespace}/{h.pod}", h.node, h.resource, h.sharing, _gpus(h.gpus),
                 *_pair(h.utilization), *_pair(h.memory), _FIGURES[h.figures]] for h in usage.holders]
        lines += _table(["POD", "NODE", "RESOURCE", "SHARING", "GPUS", "UTIL% AVG", "UTIL% MAX", "FB MiB AVG",
                         "FB MiB MAX", "FIGURES"], rows, paint) if rows else ["  no pods hold GPUs"]
    if show_idle:
        idle = usage.idle
        head = f"under {_num(usage.below)}% GPU utilisation for the last {usage.window}"
        if idle:
            lines.append(f"{paint('idle', BOLD)} GPU holders, {head}, most GPU-hours first")
            rows = [[f"{h.namespace}/{h.pod}", h.node, h.resource, h.sharing, _hours(h.idle_gpu_hours),
                     _pair(h.utilization)[1], _FIGURES[h.figures]] for h in idle]
            lines += _table(["POD", "NODE", "RESOURCE", "SHARING", "GPU-HOURS", "UTIL% MAX", "FIGURES"], rows,
                            paint, [["", "", "", "", YELLOW, "", ""] for _ in rows])
        else:
            lines.append(f"{paint('idle', BOLD)}: no GPU holder {head}")
    lines += [f"  {paint('note', YELLOW)}: {note}" for note in usage.notes]
    return [*lines, ""]


def render_table(report: Report, wide: bool = False, color: bool = False, *, usage: Usage | None = None,
                 show_usage: bool = False, show_idle: bool = False) -> str:
    paint = _Paint(color)
    lines: list[str] = []
    for node in report.nodes:
        lines += [*render_node(node, wide, paint), ""]
    if not report.nodes:
        lines.append("No GPU nodes found.")
    if report.dashboards is not None:
        lines += [*render_dashboards(report.dashboards, paint), ""]
    if usage is not None:
        lines += render_usage(usage, show_usage, show_idle, paint)
    lines += [f"{paint('note', YELLOW)}: {note}" for note in report.notes]
    lines.append(paint(summary_line(report), BOLD))
    return "\n".join(lines) + "\n"


def render(report: Report, output: str, color: bool = False, *, usage: Usage | None = None,
           show_usage: bool = False, show_idle: bool = False) -> str:
    if output in ("json", "yaml"):
        document = report.to_dict()
        if usage is not None:
            document["usage"] = usage.to_dict(show_idle)
        if output == "json":  # orjson: json.dumps(indent=2)'s text, without its pure-Python indenting encoder
            return orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n"
        return str(yaml.safe_dump(document, sort_keys=False, default_flow_style=False))
    return render_table(report, wide=output == "wide", color=color, usage=usage, show_usage=show_usage,
                        show_idle=show_idle)
