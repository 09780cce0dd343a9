"""The protocol of `make bench`'s targets (no timing here): the 3-container GPU pod is what they name, the
per-worker connection count reads /proc right, every round is judged on its own, the soak's verdict."""

from __future__ import annotations

import base64
import json
import os
import socket
from pathlib import Path

from gpu_stack_dev.bench import bodies, procfs, report, run_bench, soak, targets, wrk
from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.server.app import AppConfig, create_app


def test_the_identical_body_has_3_containers_of_20_env_and_mutate_answers_with_a_patch() -> None:
    client = create_app(AppConfig(policy=PolicyConfig())).test_client()
    for endpoint in bodies.ENDPOINTS:
        body = bodies.gpu_pod_3c(endpoint)
        containers = body.review["request"]["object"]["spec"]["containers"]
        assert [len(c["env"]) for c in containers] == [20, 20, 20]
        assert containers[0]["resources"]["limits"] == {bodies.GPU: "1"}
        response = client.post(body.path, data=body.data, content_type="application/json").get_json()["response"]
        assert response["uid"] == body.uid
        assert response["allowed"] is True
        assert ("patch" in response) is (endpoint == "mutate")
        if endpoint == "mutate":
            ops = json.loads(base64.b64decode(response["patch"]))
            assert {"op": "add", "path": "/spec/hostIPC", "value": True} in ops


def test_worker_connections_counts_the_established_sockets_each_process_holds() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        accepted = [listener.accept()[0] for _ in clients]
        try:
            # This process holds the 3 accepted ends (local port = `port`); the listening socket and the
            # client ends (local port: ephemeral) do not count.
            assert procfs.worker_connections(os.getpid(), [os.getpid()], port) == {os.getpid(): 3}
            accepted.pop().close()
            assert procfs.worker_connections(os.getpid(), [os.getpid()], port) == {os.getpid(): 2}
        finally:
            for s in clients + accepted:
                s.close()


def _run(rps: float, spread: dict[int, int], errors: int = 0, p99_ms: float = 1.0) -> wrk.Run:
    return wrk.Run(target="t", requests=int(rps * 5), seconds=5.0, errors=errors,
                         latency_us={"p50": 500.0, "p99": p99_ms * 1000, "p999": 9000.0}, late=0, worst_late_ms=0.0,
                         cpu_s=1.0, connections=0, spread=spread)


def _results(validate: list[float], mutate: list[float], spread: dict[int, int], p99_ms: float,
             rss_mb: float, errors: int = 0) -> dict[str, object]:
    rounds = len(validate)
    sat = {"baseline": wrk.Summary("baseline", [_run(1000, spread, errors) for _ in range(rounds)]),
           "validate": wrk.Summary("validate", [_run(1000 * x, spread) for x in validate]),
           "mutate": wrk.Summary("mutate", [_run(1000 * x, spread) for x in mutate])}
    paced = {"baseline": wrk.Summary("baseline", [_run(900, spread, p99_ms=1.0)]),
             "validate": wrk.Summary("validate", [_run(900, spread, p99_ms=p99_ms)])}
    return {"saturation": sat, "paced": paced, "plan": run_bench.Plan().__dict__,
            "memory_after": {"webhook": {"workers": [{"rss_kb": rss_mb * 1024}, {"rss_kb": 40 * 1024}]}}}


def _verdicts(lines: list[str]) -> dict[str, str]:
    rows = [line.split(" | ") for line in lines if line.startswith("| ") and line.count("|") == 4]
    return {row[0].lstrip("| "): row[2].rstrip(" |") for row in rows}


V_MIX = "/validate >= 0.90x the bare allow-all, every round (pod mix)"
M_MIX = "/mutate (patched) >= 0.85x the bare allow-all, every round (pod mix)"
V_ONE = "/validate >= 0.90x the bare allow-all, every round (one identical body)"
M_ONE = "/mutate (patched) >= 0.85x the bare allow-all, every round (one identical body)"
P99 = "/validate p99 <= 1.2x the bare allow-all's at 1,000/s, every round"


def test_one_round_below_the_ratio_misses_the_target_even_when_the_median_meets_it(tmp_path: Path) -> None:
    lines = targets.render(_results([0.95, 0.89, 0.97], [0.9, 0.9, 0.9], {1: 16, 2: 16}, 1.1, 59.0), tmp_path)
    verdicts = _verdicts(lines)
    assert verdicts[V_MIX] == "**missed**"
    assert verdicts[M_MIX] == "met"
    assert verdicts[P99] == "met"
    assert verdicts["worker VmRSS <= 60 MB after the 200-container sweep"] == "met"
    assert "| 2 | 1,000 | 890 | 0.89 | 900 | 0.90 | 16/16 / 16/16 / 16/16 | 0 |" in lines


def test_the_targets_judge_the_mix_and_the_identical_body_alike(tmp_path: Path) -> None:
    """Both bodies are judged by the same ratios: a run that meets them on one and not the other misses."""
    mixed_low = _results([0.95, 0.85], [0.9, 0.9], {1: 16, 2: 16}, 1.1, 59.0)
    mixed_low["saturation_same"] = _results([1.0, 1.0], [0.9, 0.9], {1: 16, 2: 16}, 1.1, 59.0)["saturation"]
    lines = targets.render(mixed_low, tmp_path)
    verdicts = _verdicts(lines)
    assert (verdicts[V_MIX], verdicts[V_ONE], verdicts[M_ONE]) == ("**missed**", "met", "met")
    assert "| 2 | 1,000 | 1,000 | 1.00 | 900 | 0.90 | 16/16 / 16/16 / 16/16 | 0 |" in lines  # the identical body
    same_low = _results([0.95, 0.95], [0.9, 0.9], {1: 16, 2: 16}, 1.1, 59.0)
    same_low["saturation_same"] = _results([0.95, 0.95], [0.8, 0.9], {1: 16, 2: 16}, 1.1, 59.0)["saturation"]
    verdicts = _verdicts(targets.render(same_low, tmp_path))
    assert (verdicts[V_MIX], verdicts[M_MIX], verdicts[V_ONE]) == ("met", "met", "met")
    assert verdicts[M_ONE] == "**missed**"
    errors = _results([0.95], [0.9], {1: 16, 2: 16}, 1.1, 59.0)
    errors["saturation_same"] = _results([0.95], [0.9], {1: 16, 2: 16}, 1.1, 59.0, errors=2)["saturation"]
    assert _verdicts(targets.render(errors, tmp_path))["zero errors (saturation, both bodies, and fixed rate)"] \
        == "**missed**"


def test_a_round_with_an_idle_worker_or_an_error_and_a_slow_p99_miss(tmp_path: Path) -> None:
    results = _results([0.95], [0.9], {1: 32, 2: 0}, 1.25, 61.0)  # p99 1.25x the bare stack's 1 ms
    results["saturation"]["mutate"].runs[0].errors = 3  # type: ignore[index]
    verdicts = _verdicts(targets.render(results, tmp_path))
    assert verdicts["connections on both workers, every round"] == "**missed**"
    assert verdicts["zero errors (saturation, both bodies, and fixed rate)"] == "**missed**"
    assert verdicts[P99] == "**missed**"
    assert verdicts["worker VmRSS <= 60 MB after the 200-container sweep"] == "**missed**"


def test_the_soak_fails_on_rss_growth_errors_or_a_replaced_worker() -> None:
    def result(end: dict[int, int], errors: int = 0) -> soak.SoakResult:
        return soak.SoakResult(rate=500, seconds=600, soak=_run(500, {}, errors=errors), warm=_run(500, {}),
                               start_rss={1: 50_000, 2: 50_000}, end_rss=end)

    assert result({1: 51_000, 2: 50_000}).failures() == []
    assert result({1: 53_000, 2: 50_000}).failures() == ["RSS growth 6.00% >= 5%"]
    assert result({1: 50_000, 2: 50_000}, errors=2).failures() == ["2 errors"]
    assert result({1: 50_000, 3: 50_000}).failures() == ["workers changed: [1, 2] -> [1, 3]"]
    report = result({1: 51_000, 2: 50_000}).markdown((1.0, 1.0, 1.0), "Many clients (200 ...): FAILED: slow")
    assert "* worker 1: RSS idle 0.0 MB, start 48.8 MB -> end 49.8 MB (+2.00%)" in report
    # The verdict is the soak's own; the many-clients phase reports on its own line.
    assert "Verdict: passed" in report.splitlines()
    assert "Verdict: FAILED: RSS growth 6.00% >= 5%" in result({1: 53_000, 2: 50_000}).markdown((1.0, 1.0, 1.0))


def test_a_bench_run_alone_keeps_the_sections_the_other_bench_scripts_wrote() -> None:
    old = ("# Benchmarks\nold figures\n\n<!-- many-clients:begin (bench/many_clients.py) -->\n## Many\nrows\n"
           "<!-- many-clients:end -->\n\n<!-- inspect-scale:begin (x) -->\nold inspect\n<!-- inspect-scale:end -->\n")
    new = "# Benchmarks\nnew figures\n\n<!-- inspect-scale:begin (x) -->\nnew inspect\n<!-- inspect-scale:end -->\n"
    out = report.keep_sections(old, new)
    assert out.startswith(new.rstrip("\n"))
    assert "## Many\nrows\n<!-- many-clients:end -->" in out
    assert "old inspect" not in out and "old figures" not in out


def test_a_round_in_slices_runs_them_in_mirrored_order_and_reports_one_run_per_server() -> None:
    """Two slices: baseline, validate, mutate, mutate, validate, baseline (reversed in the next round), each
    server's slices added up into that round's one run, its latency the slowest slice's."""
    calls: list[tuple[str, float]] = []

    class RecordingWrk:
        def run(self, target: str, server: object, manifest: Path, seconds: float, connections: int,
                rate: int = 0) -> wrk.Run:
            calls.append((target, seconds))
            n = len(calls)
            return wrk.Run(target=target, requests=1000 * n, seconds=seconds, errors=0,
                                 latency_us={"p50": 100.0 * n, "p99": 1000.0 * n, "p999": 2000.0 * n},
                                 late=0, worst_late_ms=0.0, cpu_s=0.1 * n, connections=32)

    names = [("baseline", None, Path("b")), ("validate", None, Path("v")), ("mutate", None, Path("m"))]
    out = wrk.alternate(RecordingWrk(), names, 2, 6, 32, slices=2)  # type: ignore[arg-type]
    assert [t for t, _ in calls] == ["baseline", "validate", "mutate", "mutate", "validate", "baseline",
                                     "mutate", "validate", "baseline", "baseline", "validate", "mutate"]
    assert {s for _, s in calls} == {3.0}
    first_baseline = out["baseline"].runs[0]  # calls 1 and 6
    assert (first_baseline.requests, first_baseline.seconds, first_baseline.connections) == (7000, 6.0, 64)
    assert first_baseline.latency_us == {"p50": 600.0, "p99": 6000.0, "p999": 12000.0}
    assert [len(s.runs) for s in out.values()] == [2, 2, 2]
