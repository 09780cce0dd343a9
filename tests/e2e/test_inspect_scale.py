"""`inspect` at scale against a real API server: 500 GPU nodes and 20,000 pods created through the API
(bench/inspect_scale.py builds and POSTs them), then the command's summary and request count; and
`--usage --idle` over 1,000 GPU nodes and 8,000 GPU pods against a real Prometheus (bench/inspect_usage.py).

Creating the objects takes a minute or more on a 2-CPU machine, so this runs only when asked:
GPU_STACK_E2E_SCALE=1 (`make bench-inspect` also writes the figures into BENCHMARKS.md)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from gpu_stack_dev.bench import inspect_scale as scale
from gpu_stack_dev.bench import inspect_usage
from gpu_stack_dev.e2e.e2elib import E2ECluster

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("GPU_STACK_E2E_SCALE") != "1", reason="scale test: set GPU_STACK_E2E_SCALE=1"),
]


NODES, PODS = 500, 20_000


def test_500_nodes_20000_pods(cluster: E2ECluster) -> None:
    kubeconfig = Path(cluster.kubeconfig)
    populated = scale.populate(kubeconfig, NODES, PODS)
    assert (populated.nodes, populated.pods) == (NODES, PODS)
    run = scale.run_inspect(kubeconfig, "-l", scale.SELECTOR)
    assert run.stdout.rstrip("\n").rsplit("\n", 1)[-1] == scale.expected_summary(NODES) == (
        "500 GPU nodes, 750 GPUs; free: nvidia.com/gpu 1750/2500, nvidia.com/mig-1g.5gb 125/250, "
        "nvidia.com/mig-2g.10gb 0/125, nvidia.com/mig-3g.20gb 125/125; 1000 pods holding GPU resources")
    assert run.nodes == NODES
    assert run.pods >= PODS - NODES  # one Succeeded pod per node is filtered out by the server
    # Paged: one request per 500 objects (and the ConfigMap, the two dashboard lists, the DRA slices and
    # claims), never one per node or pod.
    assert run.requests <= math.ceil(run.pods / 500) + math.ceil(run.nodes / 500) + 7


def test_usage_over_1000_nodes_and_8000_gpu_pods_with_a_real_prometheus(cluster: E2ECluster) -> None:
    # bench/inspect_usage.py's cluster and Prometheus: the clock query and one range query per metric, every pod
    # with its figures (exit 0), and the idle ones found (timings are in BENCHMARKS.md, not asserted here).
    populated, runs, _ = inspect_usage.measure(Path(cluster.kubeconfig), rounds=1)
    assert (populated.nodes, populated.pods) == (1000, 8000)
    assert [(r.output, r.status, r.queries, r.idle) for r in runs] == [
        (output, 0, 4, inspect_usage.expected_idle(1000)) for output in ("table", "json")]
    assert inspect_usage.check(runs) == ""
