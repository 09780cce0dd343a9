"""The API server's own time evaluating the chart's matchConditions, one pod create at a time, against a
constant `false` (the floor): what a change to the generated conditions (policy/signals.py) costs or saves.

    .venv/bin/python bench/match_conditions_cost.py [--against REV] [--creates 500] [--rounds 10]

A kube-apiserver v1.36 plane (hack/controlplane.py; no scheduler, no webhook server). One
ValidatingWebhookConfiguration per expression, each with that one matchCondition: the floor `false`, the
chart's mutate and validate conditions as this checkout renders them with default values, and, given
`--against`, as that git revision renders them. None is true for the pod, so nothing is called. Per round,
`--creates` dry-run creates of the pod without GPU the calls bench sends (gpu_stack_dev.e2e.apiload
pod_body(gpu=False)), one at a time, after a warm-up; per configuration, the API server's
apiserver_admission_match_condition_evaluation_seconds (its sum over its count: the object and request
turned into CEL values included) in µs per evaluation.

The API server evaluates the configurations of a request in the order of their names, and one evaluated
earlier costs more (the same `false` measured ~15 µs apart at the two ends). So the configurations are
created anew each round, the order rotated by one, behind a `false` that is always first and not reported.
Figures move with the machine; compare the rows of one run, not runs.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from io import BytesIO
from pathlib import Path
from typing import Any

import yaml

from gpu_stack_dev import controlplane
from gpu_stack_dev.bench.apiserver_metrics import MATCH_METRIC, samples, total
from gpu_stack_dev.controlplane.base import client_context
from gpu_stack_dev.e2e import apiload
from gpu_stack_dev.paths import ROOT

FLOOR = "floor (false)"
CHART = "charts/gpu-stack"
KINDS = {"MutatingWebhookConfiguration": "mutate", "ValidatingWebhookConfiguration": "validate"}
WARM_UP = 20


def chart_conditions(helm: str, chart: Path, label: str) -> dict[str, str]:
    """`{"<label> <webhook>": expression}` for the chart's two webhooks, rendered with default values."""
    rendered = subprocess.run([helm, "template", "gpu-stack", str(chart)], capture_output=True, text=True,
                              check=True).stdout
    found = {}
    for obj in yaml.safe_load_all(rendered):
        if obj and obj.get("kind") in KINDS:
            (hook,) = obj["webhooks"]
            (condition,) = hook["matchConditions"]
            found[f"{label} {KINDS[obj['kind']]}"] = condition["expression"]
    return found


def chart_at(revision: str, into: Path) -> Path:
    """The chart as `revision` has it, extracted under `into`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, CHART], capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / CHART


def configuration(name: str, expression: str) -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{"name": f"{name}.bench.gpu-stack.io", "admissionReviewVersions": ["v1"],
                          "sideEffects": "None", "failurePolicy": "Ignore", "timeoutSeconds": 1,
                          "clientConfig": {"url": "https://127.0.0.1:1/never-called"},
                          "matchConditions": [{"name": "measured", "expression": expression}],
                          "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                     "resources": ["pods"]}]}]}


def rotated(labels: Sequence[str], round_: int) -> list[str]:
    shift = round_ % len(labels)
    return [*labels[shift:], *labels[:shift]]


def per_evaluation(before: Mapping[str, tuple[float, float]], after: Mapping[str, tuple[float, float]]
                   ) -> dict[str, float]:
    """µs per evaluation for each webhook, from its (sum seconds, count) before and after."""
    return {hook: 1e6 * (after[hook][0] - before[hook][0]) / (after[hook][1] - before[hook][1])
            for hook in before if after[hook][1] > before[hook][1]}


def table(results: Mapping[str, list[float]]) -> list[str]:
    floor = statistics.median(results[FLOOR])
    lines = ["| matchCondition | µs per evaluation, per round | median | over the floor |", "|---|---|---|---|"]
    for label, values in results.items():
        median = statistics.median(values)
        over = "" if label == FLOOR else f"{median - floor:+.0f}"
        lines.append(f"| {label} | {', '.join(f'{v:.0f}' for v in values)} | {median:.0f} | {over} |")
    return lines


def measure(cluster: controlplane.Cluster, expressions: Mapping[str, str], creates: int, rounds: int
            ) -> dict[str, list[float]]:
    def kubectl(*args: str, stdin: str | None = None) -> str:
        return subprocess.run([cluster.kubectl, "--kubeconfig", str(cluster.kubeconfig), *args], input=stdin,
                              capture_output=True, text=True, check=True).stdout

    def spent(hooks: Sequence[str]) -> dict[str, tuple[float, float]]:
        page = samples(kubectl("get", "--raw", "/metrics"))
        return {h: (total(page, f"{MATCH_METRIC}_sum", [h]), total(page, f"{MATCH_METRIC}_count", [h]))
                for h in hooks}

    pod = apiload.pod_body(gpu=False)
    pod["metadata"] = {"name": "measured", "labels": pod["metadata"]["labels"]}
    body = json.dumps(pod)
    assert cluster.pki is not None
    server = urllib.parse.urlsplit(cluster.server)
    connection = http.client.HTTPSConnection(server.hostname or "", server.port,
                                             context=client_context(cluster.pki))

    def create(times: int) -> None:  # on one keep-alive connection, as the cluster's admin
        for _ in range(times):
            connection.request("POST", "/api/v1/namespaces/default/pods?dryRun=All", body,
                               {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            if response.status != 201:
                raise RuntimeError(f"dry-run create: HTTP {response.status}")

    labels = list(expressions)
    results: dict[str, list[float]] = {label: [] for label in labels}
    for round_ in range(rounds):
        order = rotated(labels, round_)
        names = {label: f"r{round_}-{i + 1:02d}" for i, label in enumerate(order)}
        configs = [configuration(f"r{round_}-00", "false")]
        configs += [configuration(names[label], expressions[label]) for label in order]
        kubectl("delete", "validatingwebhookconfigurations", "--all", "--wait")
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(configs))
        hooks = {label: f"{name}.bench.gpu-stack.io" for label, name in names.items()}
        while True:  # until the API server evaluates every new configuration
            before = spent(list(hooks.values()))
            create(WARM_UP)
            after = spent(list(hooks.values()))
            if len(per_evaluation(before, after)) == len(hooks):
                break
            time.sleep(1)
        before = after  # nothing was sent since the warm-up's last reading
        create(creates)
        measured = per_evaluation(before, spent(list(hooks.values())))
        for label in labels:
            results[label].append(measured[hooks[label]])
        print(f"  round {round_ + 1}: " + ", ".join(f"{label} {results[label][-1]:.0f}" for label in labels),
              flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="a git revision whose chart's conditions are measured beside")
    parser.add_argument("--creates", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    assets = controlplane.resolve_assets(prepare=True)
    if assets is None:
        print("no control plane: hack/envtest-assets.sh makes one from ../shared/envtest", file=sys.stderr)
        return 2
    with controlplane.ControlPlane(assets, scheduler=False) as cluster, tempfile.TemporaryDirectory() as tmp:
        helm = str(cluster.helm)
        expressions = {FLOOR: "false", **chart_conditions(helm, ROOT / CHART, "this checkout")}
        if args.against:
            expressions |= chart_conditions(helm, chart_at(args.against, Path(tmp)), args.against)
        results = measure(cluster, expressions, args.creates, args.rounds)
    print(f"\n{args.creates} dry-run creates of a 2-container pod without GPU per round, {args.rounds} rounds, "
          "kube-apiserver v1.36, one create at a time:\n")
    print("\n".join(table(results)))
    return 0
