"""`gpu-stack-webhook inspect` and the kubectl plugin `kubectl gpu-stack inspect` (console script
`kubectl-gpu_stack`): argument parsing only; data from fetch.py, model from model.py (records in
records.py, dashboards in dashboards.py), output from render.py.

Exit status: 0 printed, 1 the cluster could not be read (the message says why), 2 bad arguments. With
--usage or --idle (the allocation table is printed whatever Prometheus answers): 3 Prometheus could not be
asked (unreachable, timed out, an error status, not a Prometheus), 4 it refused the credentials (401/403),
5 it has no dcgm-exporter series, 6 figures with a gap (a holder pod without series, or clock skew).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_stack_webhook.gpuinspect import fetch as inspect_fetch
from gpu_stack_webhook.gpuinspect import model as inspect_model
from gpu_stack_webhook.gpuinspect import records as inspect_records
from gpu_stack_webhook.gpuinspect import render as inspect_render
from gpu_stack_webhook.gpuinspect import usage_query
from gpu_stack_webhook.gpuinspect.dashboards import dashboards as found_dashboards
from gpu_stack_webhook.gpuinspect.prometheus import Client as PrometheusClient
from gpu_stack_webhook.kube.client import KubernetesClientApi
from gpu_stack_webhook.kube.live import DevicePluginReader, OperatorReader, add_source_arguments
from gpu_stack_webhook.policy.config import ConfigError, PolicyConfig
from gpu_stack_webhook.policy.sharing import SharingIndex
from gpu_stack_webhook.settings import load_terminal_settings

PLUGIN_PROG = "kubectl gpu-stack"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# --usage / --idle: Prometheus unreachable, refused, no dcgm-exporter series, figures with a gap
USAGE_EXIT = {"unreachable": 3, "refused": 4, "no-series": 5, "partial": 6, "ok": EXIT_OK}


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=inspect_render.OUTPUTS, default="table",
                        help="table (default), wide (more columns), json or yaml (schema "
                             f"{inspect_records.SCHEMA_VERSION})")
    parser.add_argument("--node", action="append", default=[], metavar="NAME",
                        help="only this node; repeatable")
    parser.add_argument("-l", "--selector", metavar="SELECTOR",
                        help="only nodes matching this label selector, e.g. nvidia.com/gpu.product=Tesla-T4")
    parser.add_argument("-n", "--namespace",
                        help="list only this namespace's pods as holders (requested and free still count all pods)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default $KUBECONFIG, then ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument("--configmap-namespace", default="gpu-stack",
                        help="namespace of the gpu-stack release (default %(default)s)")
    parser.add_argument("--configmap", default="gpu-stack-device-plugin-configs",
                        help="the chart's device plugin ConfigMap, <fullname>-device-plugin-configs "
                             "(default %(default)s)")
    parser.add_argument("--dashboards-namespace", metavar="NAMESPACE",
                        help="where the chart's Grafana dashboards are (monitoring.dashboards.namespace; "
                             "default: --configmap-namespace)")
    add_source_arguments(parser, "chart", "where the sharing configs come from, as for the webhook "
                                          "(webhook.policySource): chart: the chart's --configmap")
    parser.add_argument("--chunk-size", type=_positive, default=inspect_fetch.DEFAULT_CHUNK_SIZE,
                        help="objects per list request (default %(default)s)")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                        help="auto: on a terminal unless NO_COLOR is set (default)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print the objects read, requests made and seconds taken to stderr")
    usage_query.add_arguments(parser)


def run(args: argparse.Namespace, api: Any = None) -> int:
    """`api`: an already configured kubernetes ApiClient (tests); else the user's kubeconfig."""
    query = inspect_fetch.Query(nodes=tuple(args.node), node_selector=args.selector, namespace=args.namespace,
                               configmap_namespace=args.configmap_namespace, configmap_name=args.configmap,
                               dashboards_namespace=args.dashboards_namespace, chunk_size=args.chunk_size,
                               chart_configmap=args.policy_source == "chart")
    asking: list[tuple[usage_query.Pending, list[str]]] = []  # Prometheus, asked while the cluster is read
    bad_usage_flags: list[Exception] = []

    def ask_prometheus(annotations: Mapping[str, str]) -> None:
        try:
            chosen, setting_notes = usage_query.settings(args, annotations)
            client = PrometheusClient(usage_query.transport(args, api))
        except (ValueError, OSError) as exc:
            bad_usage_flags.append(exc)
            return
        asking.append((usage_query.Pending(client, chosen), setting_notes))

    try:
        api = api or inspect_fetch.api_client(args.kubeconfig, args.context)
        snapshot = inspect_fetch.fetch(api, query, ask_prometheus if args.usage or args.idle else None)
    except inspect_fetch.InspectError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if bad_usage_flags:
        print(f"error: {bad_usage_flags[0]}", file=sys.stderr)
        return EXIT_USAGE
    notes = list(snapshot.notes)
    sharing = None
    if args.policy_source != "chart":
        sharing, note = live_sharing(args, api)
        notes += [note] if note else []
    elif snapshot.configs is not None:
        try:
            sharing = inspect_model.sharing_from_configmap(snapshot.configs, snapshot.default_config)
        except ConfigError as exc:
            notes.append(f"ConfigMap {query.configmap_namespace}/{query.configmap_name}: {exc}")
    dashboards = None if snapshot.dashboards is None else found_dashboards(
        query.dashboards_in, *snapshot.dashboards)
    report = inspect_model.build_report(snapshot.nodes, snapshot.pods, sharing, holder_namespace=args.namespace,
                                        notes=notes, dashboards=dashboards,
                                        resource_slices=snapshot.resource_slices,
                                        resource_claims=snapshot.resource_claims)
    usage, asked_seconds = None, 0.0
    if asking:
        pending, setting_notes = asking[0]
        usage = pending.usage(report)
        asked_seconds = pending.seconds
        if setting_notes:
            usage = dataclasses.replace(usage, notes=(*setting_notes, *usage.notes))
    color = args.output in ("table", "wide") and inspect_render.color_wanted(
        args.color, sys.stdout, load_terminal_settings())
    sys.stdout.write(inspect_render.render(report, args.output, color=color, usage=usage, show_usage=args.usage,
                                           show_idle=args.idle))
    if args.verbose:
        print(f"read {len(snapshot.nodes)} nodes and {len(snapshot.pods)} pods in {snapshot.requests} requests, "
              f"{snapshot.seconds:.2f} s", file=sys.stderr)
        if usage is not None:
            print(f"asked Prometheus at {usage.where} {usage.queries} queries, {asked_seconds:.2f} s", file=sys.stderr)
    if usage is not None and usage.error is not None:
        print(f"error: {usage.error}", file=sys.stderr)
    return EXIT_OK if usage is None else USAGE_EXIT[usage.status]


def live_sharing(args: argparse.Namespace, api: Any) -> tuple[SharingIndex | None, str]:
    """The sharing configs the webhook follows with --policy-source (the same reader, the same message
    when they cannot be read: the webhook then refuses GPU pods, GPU010)."""
    reads = KubernetesClientApi(api, inspect_fetch.DEFAULT_TIMEOUT)
    if args.policy_source == "gpu-operator":
        reader: OperatorReader | DevicePluginReader = OperatorReader(reads, args.cluster_policy,
                                                                     args.operator_namespace)
    else:
        namespace, _, name = (args.plugin_configmap or "").partition("/")
        reader = DevicePluginReader(reads, namespace, name, args.plugin_default_config)
    config = reader(PolicyConfig())
    if config.source_error:
        return None, (f"{reader.describe()}: {config.source_error}; the webhook refuses GPU pods until it can "
                      "read it (GPU010); sharing is shown as GFD labels it")
    return SharingIndex(config), ""


def plugin_main(argv: Sequence[str] | None = None) -> int:
    """`kubectl gpu-stack inspect ...` (kubectl runs `kubectl-gpu_stack inspect ...`)."""
    parser = argparse.ArgumentParser(prog=PLUGIN_PROG, description="gpu-stack: see the cluster's GPUs.")
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser("inspect", help="GPU nodes, their sharing mode and who holds what")
    add_arguments(inspect)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(plugin_main())
