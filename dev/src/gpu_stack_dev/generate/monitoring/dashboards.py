"""The chart's Grafana dashboards: GPU fleet, Sharing and Admission. Each is described here as rows of
panels with their PromQL, then built with Grafana's grafana-foundation-sdk (pinned in requirements-dev.txt)
into the dashboard JSON that generate.py writes to charts/gpu-stack/files/monitoring/dashboards/ and the chart
ships as ConfigMaps (templates/monitoring/dashboards.yaml, monitoring.dashboards).

Data sources: the DCGM exporter (its Kubernetes mapping adds `pod`, `namespace`, `container`; scraped without
honorLabels they arrive as `exported_pod`, `exported_namespace`; `Hostname` is `hostname` in some setups),
kube-state-metrics, the API server and the webhook's /metrics. A panel whose source is not scraped shows
"No data", never an error, and the panels fall back to node and GPU when the pod mapping is off.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from typing import Any

from gpu_stack_dev.generate.monitoring import idle
from gpu_stack_dev.generate.monitoring.alerts import GPU_RESOURCES, WEBHOOK_NAMES, WEBHOOK_TARGET
from gpu_stack_dev.generate.monitoring.placeholders import IDLE_GPU_PERCENT, IDLE_GPU_WINDOW

with warnings.catch_warnings():
    # The classic (v1) dashboard model, what file provisioning reads, warns that v2 exists.
    warnings.simplefilter("ignore", DeprecationWarning)
    from grafana_foundation_sdk.builders import common, prometheus, stat, table, text, timeseries
    from grafana_foundation_sdk.builders import dashboard as gdash
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
NO_DATA = "No data"


def dcgm(metric: str, selector: str = "") -> str:
    """A DCGM exporter series with its labels made uniform: `pod`/`namespace` from the Kubernetes mapping
    whether scraped with honorLabels (kept) or without (exported_*), `Hostname` whichever case it has."""
    expr = f"{metric}{{{selector}}}" if selector else metric
    for target, source in (("pod", "exported_pod"), ("namespace", "exported_namespace"), ("Hostname", "hostname")):
        expr = f'label_replace({expr}, "{target}", "$1", "{source}", "(.+)")'
    return expr


GPU_LEGEND = "{{Hostname}} GPU {{gpu}} {{namespace}}/{{pod}}"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class Panel:
    title: str
    kind: str  # timeseries, stat, table, text
    queries: tuple[Query, ...] = ()
    unit: str = ""
    description: str = ""
    width: int = 12
    height: int = 8
    content: str = ""  # text panels (markdown)
    max_value: float | None = None


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: tuple[tuple[str, tuple[Panel, ...]], ...] = field(default_factory=tuple)

    def panels(self) -> list[Panel]:
        return [p for _, panels in self.rows for p in panels]

    def queries(self) -> list[Query]:
        return [q for p in self.panels() for q in p.queries]


GPU_FLEET = Dashboard(
    "gpu-stack-gpu-fleet", "gpu-stack / GPU fleet",
    "Every GPU per node: utilisation, framebuffer, temperature, power and XID errors, with the pod using it "
    "(the DCGM exporter's Kubernetes mapping; without it, node and GPU only), and the GPUs pods hold idle.",
    (
        ("Fleet", (
            Panel("GPUs reporting", "stat", (Query("count(DCGM_FI_DEV_GPU_UTIL)", instant=True),), width=6, height=4,
                  description="GPUs the DCGM exporters report."),
            Panel("Mean GPU utilisation", "stat", (Query("avg(DCGM_FI_DEV_GPU_UTIL)", instant=True),), unit="percent",
                  width=6, height=4),
            Panel("Framebuffer used", "stat", (Query("sum(DCGM_FI_DEV_FB_USED) * 1024 * 1024", instant=True),),
                  unit="bytes", width=6, height=4),
            Panel("GPUs with an XID error", "stat", (Query("count(DCGM_FI_DEV_XID_ERRORS != 0) or vector(0)",
                                                           instant=True),), width=6, height=4,
                  description="GPUs whose last XID is not 0 (the gauge never resets: see the XID panel)."),
        )),
        ("Per GPU", (
            Panel("GPU utilisation", "timeseries", (Query(dcgm("DCGM_FI_DEV_GPU_UTIL"), GPU_LEGEND),), unit="percent",
                  max_value=100),
            Panel("Framebuffer used", "timeseries",
                  (Query(f"{dcgm('DCGM_FI_DEV_FB_USED')} * 1024 * 1024", GPU_LEGEND),), unit="bytes"),
            Panel("Framebuffer free", "timeseries",
                  (Query(f"{dcgm('DCGM_FI_DEV_FB_FREE')} * 1024 * 1024", GPU_LEGEND),), unit="bytes"),
            Panel("Temperature", "timeseries", (Query(dcgm("DCGM_FI_DEV_GPU_TEMP"), GPU_LEGEND),), unit="celsius"),
            Panel("Power", "timeseries", (Query(dcgm("DCGM_FI_DEV_POWER_USAGE"), GPU_LEGEND),), unit="watt"),
            Panel("Last XID error", "timeseries", (Query(dcgm("DCGM_FI_DEV_XID_ERRORS"), GPU_LEGEND),),
                  description="The last XID each GPU reported (0: none since the exporter started). A step is "
                              "a new error; XID 79 means the GPU fell off the bus."),
        )),
        ("Who uses which GPU", (
            Panel("GPUs and their pods", "table",
                  (Query(dcgm("DCGM_FI_DEV_GPU_UTIL"), instant=True),), width=24,
                  description="One row per GPU and pod using it. Empty pod and namespace: no pod holds the GPU, "
                              "or the exporter's Kubernetes mapping is off."),
        )),
        ("Idle allocated GPUs", (
            Panel("Idle allocated GPUs", "stat", (Query(idle.idle_devices_now(), instant=True),), width=6,
                  description=f"GPUs and MIG instances a pod holds that have stayed under {IDLE_GPU_PERCENT}% busy "
                              f"for {IDLE_GPU_WINDOW} (monitoring.idleGpu; the alert GPUStackGPUAllocatedIdle). A "
                              "shared GPU counts once, and only while every pod on it is idle."),
            Panel("Idle allocated GPUs by pod", "table", (Query(idle.idle_devices_by_pod(), instant=True),),
                  width=18, description=f"Pods whose GPUs have stayed under {IDLE_GPU_PERCENT}% busy for "
                                        f"{IDLE_GPU_WINDOW}: how many each holds idle. `kubectl gpu-stack inspect "
                                        "--idle` lists them from the cluster's allocations."),
            Panel(f"GPU-hours idle by namespace, last {idle.HOURS_RANGE}", "table",
                  (Query(idle.idle_gpu_hours(("namespace",)), instant=True),), unit="h",
                  description=f"GPU-hours held under {IDLE_GPU_PERCENT}% busy, counted once a GPU had been idle "
                              f"for {IDLE_GPU_WINDOW} (while the alert fires), in {idle.HOURS_STEP_MINUTES}-minute "
                              "steps. A shared GPU counts for each pod on it."),
            Panel(f"GPU-hours idle by pod, last {idle.HOURS_RANGE}", "table",
                  (Query(idle.idle_gpu_hours(("namespace", "pod")), instant=True),), unit="h",
                  description="The same GPU-hours per pod."),
        )),
    ),
)

WITH_POD, WITH_EXPORTED_POD = 'pod!=""', 'exported_pod!=""'
SHARED_RESOURCES = 'resource=~"nvidia_com_gpu.*"'
SHARING = Dashboard(
    "gpu-stack-sharing", "gpu-stack / GPU sharing",
    "How full each shared GPU is: replicas requested vs advertised (kube-state-metrics), pods per GPU, MIG.",
    (
        ("Replicas", (
            Panel("Requested vs advertised, per node and resource", "timeseries", (
                Query(f"sum by (node, resource) (kube_pod_container_resource_requests{{{GPU_RESOURCES}}} "
                      '* on (namespace, pod) group_left () (kube_pod_status_phase{phase="Running"} == 1))',
                      "{{node}} {{resource}} requested"),
                Query(f"max by (node, resource) (kube_node_status_allocatable{{{GPU_RESOURCES}}})",
                      "{{node}} {{resource}} advertised"),
            ), description="Time-sliced or MPS replicas (and whole GPUs, MIG devices) requested by running "
                           "pods, against what each node advertises."),
            Panel("Share of advertised replicas in use", "stat", (
                Query(f"sum(kube_pod_container_resource_requests{{{GPU_RESOURCES}}} "
                      '* on (namespace, pod) group_left () (kube_pod_status_phase{phase="Running"} == 1)) '
                      f"/ sum(kube_node_status_allocatable{{{GPU_RESOURCES}}})", instant=True),
            ), unit="percentunit", width=6),
            Panel("Replicas per physical GPU", "table", (
                Query(f"max by (node, resource) (kube_node_status_capacity{{{SHARED_RESOURCES}}}) / on (node) "
                      'group_left () count by (node) (label_replace(label_replace(DCGM_FI_DEV_GPU_UTIL, "node", '
                      '"$1", "Hostname", "(.+)"), "node", "$1", "hostname", "(.+)"))', instant=True),
            ), width=6, description="Advertised devices divided by the GPUs the node's DCGM exporter reports: the "
                                    "time-slicing or MPS replica count. Assumes the exporter's Hostname is the "
                                    "node name."),
        )),
        ("Pods per GPU", (
            Panel("Pods per GPU", "timeseries", (
                Query(f"count by (Hostname, gpu) ({dcgm('DCGM_FI_DEV_GPU_UTIL', WITH_POD)} "
                      f"or {dcgm('DCGM_FI_DEV_GPU_UTIL', WITH_EXPORTED_POD)})", "{{Hostname}} GPU {{gpu}}"),
            ), description="Approximate: pods the DCGM exporter maps to each GPU. With time-slicing and MPS every "
                           "pod shares the whole GPU's counters, so per-pod utilisation cannot be told apart."),
            Panel("About attribution", "text", content=(
                "**Attribution is approximate.** Time-sliced and MPS replicas share one physical GPU: the DCGM "
                "exporter reports the GPU's counters once per pod holding a replica, so utilisation and memory are "
                "the GPU's, not the pod's. MIG instances are real partitions and are measured on their own "
                "(`DEV_*_UTIL` is not supported on MIG; the MIG panels read `DCGM_FI_PROF_GR_ENGINE_ACTIVE`, which "
                "needs a datacenter GPU)."), description="What the sharing panels can and cannot tell."),
        )),
        ("MIG", (
            Panel("MIG devices requested by running pods, per profile", "timeseries", (
                Query('sum by (node, resource) (kube_pod_container_resource_requests{resource=~"nvidia_com_mig_.*"} '
                      '* on (namespace, pod) group_left () (kube_pod_status_phase{phase="Running"} == 1))',
                      "{{node}} {{resource}}"),
            )),
            Panel("MIG instance activity (graphics engine)", "timeseries", (
                Query(dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 'GPU_I_PROFILE!=""'),
                      "{{Hostname}} GPU {{gpu}} {{GPU_I_PROFILE}} #{{GPU_I_ID}} {{namespace}}/{{pod}}"),
            ), unit="percentunit", max_value=1,
                  description="Per MIG instance: the ratio of time its graphics engine is active."),
        )),
    ),
)

ADMISSION = Dashboard(
    "gpu-stack-admission", "gpu-stack / Admission",
    "The gpu-stack webhook: reviews by endpoint and outcome, denials and patches by rule, its latency, and the "
    "API server's own view of the calls.",
    (
        ("Webhook", (
            Panel("Webhook targets up", "stat", (Query(f"sum(up{{{WEBHOOK_TARGET}}})", instant=True),), width=6,
                  description="Webhook pods Prometheus scrapes successfully."),
            Panel("Reviews per second", "stat", (
                Query("sum(rate(gpu_stack_admission_reviews_total[5m]))", instant=True),), unit="reqps", width=6),
            Panel("Denied share", "stat", (
                Query('sum(rate(gpu_stack_admission_reviews_total{decision="denied"}[5m])) / '
                      "sum(rate(gpu_stack_admission_reviews_total[5m]))", instant=True),),
                  unit="percentunit", width=6),
            Panel("Errors per second", "stat", (
                Query('sum(rate(gpu_stack_admission_reviews_total{decision="error"}[5m])) or vector(0)',
                      instant=True),), unit="reqps", width=6),
            Panel("Reviews by endpoint and outcome", "timeseries", (
                Query("sum by (endpoint, decision) (rate(gpu_stack_admission_reviews_total[5m]))",
                      "{{endpoint}} {{decision}}"),), unit="reqps"),
            Panel("Denials by rule", "timeseries", (
                Query('sum by (rule) (rate(gpu_stack_rule_findings_total{severity="deny"}[5m]))', "{{rule}}"),),
                  unit="reqps"),
            Panel("Patches and warnings by rule (mutate endpoint)", "timeseries", (
                Query('sum by (rule) (rate(gpu_stack_rule_findings_total{endpoint="mutate", severity="warn"}[5m]))',
                      "{{rule}}"),), unit="reqps",
                  description="Rules that patched or warned on /mutate (the webhook counts both as `warn`)."),
            Panel("Webhook latency (its own histogram)", "timeseries", (
                Query("histogram_quantile(0.5, sum by (endpoint, le) "
                      "(rate(gpu_stack_admission_duration_seconds_bucket[5m])))", "{{endpoint}} p50"),
                Query("histogram_quantile(0.99, sum by (endpoint, le) "
                      "(rate(gpu_stack_admission_duration_seconds_bucket[5m])))", "{{endpoint}} p99"),
            ), unit="s", description="From routing to the serialised response, inside the webhook."),
        )),
        ("The API server's view", (
            Panel("Call latency seen by the API server", "timeseries", (
                Query("histogram_quantile(0.99, sum by (name, type, le) (rate("
                      f"apiserver_admission_webhook_admission_duration_seconds_bucket{{{WEBHOOK_NAMES}}}[5m])))",
                      "{{name}} p99"),
                Query("histogram_quantile(0.5, sum by (name, type, le) (rate("
                      f"apiserver_admission_webhook_admission_duration_seconds_bucket{{{WEBHOOK_NAMES}}}[5m])))",
                      "{{name}} p50"),
            ), unit="s", description="Network and TLS included; the webhook times out at webhook.timeoutSeconds."),
            Panel("Rejections by error type", "timeseries", (
                Query(f"sum by (name, error_type) (rate(apiserver_admission_webhook_rejection_count{{{WEBHOOK_NAMES}}}"
                      "[5m]))", "{{name}} {{error_type}}"),), unit="reqps",
                  description="no_error: the webhook denied; calling_webhook_error: the call failed (fail closed)."),
            Panel("Fail-open calls", "timeseries", (
                Query(f"sum by (name) (rate(apiserver_admission_webhook_fail_open_count{{{WEBHOOK_NAMES}}}[5m]))",
                      "{{name}}"),), unit="reqps",
                  description="Calls that failed and were admitted anyway (failurePolicy Ignore)."),
        )),
    ),
)

DASHBOARDS = (GPU_FLEET, SHARING, ADMISSION)


def _query(q: Query, ref: str, kind: str) -> prometheus.Dataquery:
    out = prometheus.Dataquery().expr(q.expr).ref_id(ref).datasource(DATASOURCE)
    if q.legend:
        out = out.legend_format(q.legend)
    if q.instant:
        out = out.instant()
    if kind == "table":
        out = out.format(PromQueryFormat.TABLE)
    return out


def _panel(p: Panel, pos: GridPos) -> Any:
    builder: Any
    if p.kind == "timeseries":
        builder = timeseries.Panel().fill_opacity(10)
    elif p.kind == "stat":
        builder = stat.Panel().reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
    elif p.kind == "table":
        builder = table.Panel()
    elif p.kind == "text":
        builder = text.Panel().content(p.content)
    else:
        raise ValueError(f"unknown panel kind {p.kind}")
    builder = builder.title(p.title).grid_pos(pos)
    if p.description:
        builder = builder.description(p.description)
    if p.kind != "text":
        builder = builder.datasource(DATASOURCE).no_value(NO_DATA)
        for i, q in enumerate(p.queries):
            builder = builder.with_target(_query(q, chr(ord("A") + i), p.kind))
    if p.unit:
        builder = builder.unit(p.unit)
    if p.max_value is not None:
        builder = builder.min(0).max(p.max_value)
    return builder


def layout(d: Dashboard) -> list[tuple[str, list[tuple[Panel, GridPos]]]]:
    """Rows of panels placed left to right, wrapping at Grafana's 24 columns; a row header takes 1."""
    out, y = [], 0
    for title, panels in d.rows:
        y += 1
        x, row_h, placed = 0, 0, []
        for p in panels:
            if x + p.width > 24:
                x, y, row_h = 0, y + row_h, 0
            placed.append((p, GridPos(h=p.height, w=p.width, x=x, y=y)))
            x, row_h = x + p.width, max(row_h, p.height)
        y += row_h
        out.append((title, placed))
    return out


def build(d: Dashboard) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        builder = (gdash.Dashboard(d.title).uid(d.uid).description(d.description)
                   .tags(["gpu-stack", "gpu"]).refresh("1m").time("now-6h", "now").timezone("browser")
                   .with_variable(gdash.DatasourceVariable("datasource").label("Data source").type("prometheus")))
        row_y = 0
        for title, placed in layout(d):
            row_y = placed[0][1].y - 1 if placed else row_y
            builder = builder.with_row(gdash.Row(title).grid_pos(GridPos(h=1, w=24, x=0, y=row_y)))
            for p, pos in placed:
                builder = builder.with_panel(_panel(p, pos))
        model = builder.build()
    out: dict[str, Any] = json.loads(json.dumps(model, cls=JSONEncoder, sort_keys=True))
    return out


def json_text(d: Dashboard) -> str:
    return json.dumps(build(d), indent=2, sort_keys=True) + "\n"
