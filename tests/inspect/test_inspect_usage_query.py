"""`inspect --usage`: the thresholds (flags, then the chart's annotations, then 5 % / 30m), the queries made
(the clock, then one range query per metric whatever the number of pods), and the exit status each outcome
gives."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import pytest
from gpu_stack_dev.inspect_cluster import NODES, PODS
from gpu_stack_webhook.gpuinspect import command, model, usage_query
from gpu_stack_webhook.gpuinspect.prometheus import Client, PrometheusError


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(("argv", "annotations", "expected"), [
    ((), {}, ("30m", 1800.0, 5.0)),
    ((), {"gpu-stack.io/idle-gpu-utilization-percent-below": "10", "gpu-stack.io/idle-gpu-window": "2h"},
     ("2h", 7200.0, 10.0)),
    (("--since", "15m", "--idle-below", "1"), {"gpu-stack.io/idle-gpu-utilization-percent-below": "10",
                                               "gpu-stack.io/idle-gpu-window": "2h"}, ("15m", 900.0, 1.0)),
])
def test_flags_win_then_the_chart_then_the_defaults(argv: Sequence[str], annotations: dict[str, str],
                                                     expected: tuple[str, float, float]) -> None:
    chosen, notes = usage_query.settings(args(*argv), annotations)
    assert ((chosen.window, chosen.seconds, chosen.below), notes) == (expected, [])


def test_a_bad_annotation_is_a_note_and_the_default() -> None:
    chosen, notes = usage_query.settings(args(), {"gpu-stack.io/idle-gpu-utilization-percent-below": "low",
                                                  "gpu-stack.io/idle-gpu-window": "soon"})
    assert (chosen.window, chosen.below) == ("30m", 5.0)
    assert notes == ["gpu-stack.io/idle-gpu-window: not a duration: 'soon' (e.g. 30m, 2h, 90s); using 30m",
                     "gpu-stack.io/idle-gpu-utilization-percent-below: not a number ('low'); using 5"]


@pytest.mark.parametrize("argv", [("--since", "soon"), ("--idle-below", "0"), ("--idle-below", "150")])
def test_bad_flags_are_errors(argv: Sequence[str]) -> None:
    with pytest.raises(ValueError):
        usage_query.settings(args(*argv), {})


def test_the_service_flag_is_namespace_name_port() -> None:
    with pytest.raises(ValueError, match="NAMESPACE/NAME:PORT"):
        usage_query.transport(args("--prometheus-service", "monitoring/prometheus"), api=None)
    with pytest.raises(ValueError, match="http:// or https://"):
        usage_query.transport(args("--prometheus", "file:///etc/passwd"), api=None)


class FakeTransport:
    """Answers like a Prometheus whose series are `result` (or fails with `error`); records the queries."""

    where = "http://fake"

    def __init__(self, result: list[dict[str, object]], error: PrometheusError | None = None,
                 clock: float = 1_000_000.0) -> None:
        self.result, self.error, self.clock = result, error, clock
        self.asked: list[tuple[str, str]] = []

    def get(self, path: str, params: Sequence[tuple[str, str]]) -> bytes:
        query = dict(params)["query"]
        metric = query.rsplit("(", 1)[-1].rstrip(")")  # max by (...) (METRIC)
        self.asked.append((path, query if path == "/api/v1/query" else metric))
        if self.error is not None:
            raise self.error
        if path == "/api/v1/query":
            return json.dumps({"status": "success", "data": {"resultType": "scalar",
                                                              "result": [self.clock, str(self.clock)]}}).encode()
        found = [r for r in self.result if r["metric"]["__name__"] == metric]  # type: ignore[index]
        return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": found}}).encode()


MIG = {"mig-small": "1g.5gb", "mig-medium": "3g.20gb"}


def _series(name: str, namespace: str, pod: str, value: float, clock: float = 1_000_000.0) -> dict[str, object]:
    mig = {"GPU_I_PROFILE": MIG[pod], "GPU_I_ID": "1"} if pod in MIG else {}
    return {"metric": {"__name__": name, "namespace": namespace, "pod": pod, "Hostname": "n", **mig},
            "values": [[clock - 1800 + 60 * i, str(value)] for i in range(31)]}


def _status(transport: FakeTransport, local_clock: float = 1_000_000.0) -> tuple[str, int]:
    report = model.build_report(NODES, PODS)
    chosen, _ = usage_query.settings(args(), {})
    usage = usage_query.ask(report, Client(transport), chosen, clock=lambda: local_clock)
    return usage.status, command.USAGE_EXIT[usage.status]


def test_one_query_per_metric_whatever_the_pods() -> None:
    transport = FakeTransport([_series("DCGM_FI_DEV_GPU_UTIL", "ml", "train-bert", 1)])
    _status(transport)
    assert transport.asked == [("/api/v1/query", "time()"), ("/api/v1/query_range", "DCGM_FI_DEV_GPU_UTIL"),
                               ("/api/v1/query_range", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
                               ("/api/v1/query_range", "DCGM_FI_DEV_FB_USED")]


def test_exit_statuses() -> None:
    every = [_series(m, p["metadata"]["namespace"], p["metadata"]["name"], 50)
             for p in PODS for m in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED")]
    assert _status(FakeTransport(every)) == ("ok", 0)
    assert _status(FakeTransport(every), local_clock=1_000_000.0 - 60) == ("partial", 6)  # clock skew
    assert _status(FakeTransport(every[:4])) == ("partial", 6)  # holders without series
    assert _status(FakeTransport([])) == ("no-series", 5)
    assert _status(FakeTransport([], PrometheusError("unreachable", "cannot reach"))) == ("unreachable", 3)
    assert _status(FakeTransport([], PrometheusError("refused", "403"))) == ("refused", 4)


def test_each_range_query_keeps_only_the_labels_read() -> None:
    transport = FakeTransport([])
    _status(transport)
    assert len(transport.asked) == 4
    assert usage_query.gpu_usage.range_query("DCGM_FI_DEV_GPU_UTIL") == (
        "max by (namespace, pod, pod_namespace, pod_name, vgpu, GPU_I_PROFILE, GPU_I_ID, dra_device_name, "
        "dra_mig_profile, Hostname, hostname, UUID, uuid, gpu) (DCGM_FI_DEV_GPU_UTIL)")
