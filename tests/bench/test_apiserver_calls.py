"""The bookkeeping of bench/apiserver_load.py's second part (gpu_stack_dev.bench.apiserver_calls): the
mixed creates, the API server's call counter read by webhook and type, the matchConditions patches for
`before` and `after`, the latency ratio and its verdict. No cluster, no timing."""

from __future__ import annotations

import itertools

import pytest
from gpu_stack_dev.bench import apiserver_calls as ac
from gpu_stack_dev.bench.apiserver_metrics import MATCH_METRIC, WEBHOOK_METRIC, samples, total
from gpu_stack_dev.e2e.apiload import arrivals


def _sample(name: str, operation: str, rejected: str, kind: str, value: int) -> str:
    return (f'{ac.CALL_METRIC}{{code="200",name="{name}",operation="{operation}",rejected="{rejected}",'
            f'type="{kind}"}} {value}')


METRICS = "\n".join([
    f"# HELP {ac.CALL_METRIC} [ALPHA] Admission webhook request total",
    f"# TYPE {ac.CALL_METRIC} counter",
    _sample("mutate.gpu-stack.io", "CREATE", "false", "admit", 120),
    _sample("mutate.gpu-stack.io", "DELETE", "false", "admit", 3),
    _sample("validate.gpu-stack.io", "CREATE", "true", "validating", 7),
    _sample("validate.gpu-stack.io", "CREATE", "false", "validating", 110),
    _sample("other.example.com", "CREATE", "false", "admit", 99),
    f'{ac.CALL_METRIC}_other{{name="mutate.gpu-stack.io",type="admit"}} 5', ""])
HOOKS = ("mutate.gpu-stack.io", "validate.gpu-stack.io")


def test_one_pod_in_ten_asks_for_a_gpu_in_any_thousand_consecutive_creates() -> None:
    assert [i for i in range(30) if ac.gpu_at(i)] == [9, 19, 29]
    for start in (0, 7, 1234):
        assert sum(ac.gpu_at(i) for i in range(start, start + 1000)) == 100


def test_calls_are_summed_by_webhook_and_type_over_the_other_labels() -> None:
    calls = ac.parse_calls(samples(METRICS), HOOKS)
    assert calls == {("mutate.gpu-stack.io", "admit"): 123.0, ("validate.gpu-stack.io", "validating"): 117.0}
    later = {**calls, ("mutate.gpu-stack.io", "admit"): 223.0}
    assert ac.delta(later, calls) == {("mutate.gpu-stack.io", "admit"): 100.0,
                                      ("validate.gpu-stack.io", "validating"): 0.0}
    assert ac.parse_calls(samples('x{a="1"} 2\n'), HOOKS) == {}
    # A comma inside a quoted label value does not split the labels.
    quoted = 'apiserver_admission_webhook_request_total{name="mutate.gpu-stack.io",code="a,b",type="admit"} 4\n'
    assert ac.parse_calls(samples(quoted), HOOKS) == {("mutate.gpu-stack.io", "admit"): 4.0}


def test_the_api_servers_time_is_its_histogram_sum_for_our_webhooks() -> None:
    metric = MATCH_METRIC
    text = "\n".join([
        f"# HELP {metric} [ALPHA] Admission match condition evaluation time in seconds",
        f"# TYPE {metric} histogram",
        f'{metric}_bucket{{kind="webhook",name="mutate.gpu-stack.io",operation="CREATE",type="admit",le="+Inf"}} 9',
        f'{metric}_sum{{kind="webhook",name="mutate.gpu-stack.io",operation="CREATE",type="admit"}} 0.25',
        f'{metric}_count{{kind="webhook",name="mutate.gpu-stack.io",operation="CREATE",type="admit"}} 9',
        f'{metric}_sum{{kind="webhook",name="validate.gpu-stack.io",operation="CREATE",type="validating"}} 0.5',
        f'{metric}_sum{{kind="webhook",name="other.example.com",operation="CREATE",type="admit"}} 7',
        f'{metric}_sum{{kind="policy",name="validate.gpu-stack.io",operation="UPDATE",type="validating"}} 0.125',
        "", ])
    assert total(samples(text), f"{metric}_sum", HOOKS) == pytest.approx(0.875)
    assert total(samples(METRICS), f"{metric}_sum", HOOKS) == 0.0
    assert total(samples(text), f"{WEBHOOK_METRIC}_sum", HOOKS) == 0.0
    assert total(samples(text), f"{metric}_count") == 9  # every webhook's, without `webhooks`


RENDERED = {"kind": "ValidatingWebhookConfiguration", "metadata": {"name": "v"}, "webhooks": [
    {"name": "validate.gpu-stack.io", "matchConditions": [{"name": "gpu", "expression": "true"}]},
    {"name": "other.gpu-stack.io"}]}


def test_before_removes_every_match_condition_and_after_puts_back_what_the_chart_rendered() -> None:
    assert ac.without_conditions(RENDERED) == [{"op": "remove", "path": "/webhooks/0/matchConditions"}]
    assert ac.without_conditions({"webhooks": [{"name": "a"}]}) == []  # nothing rendered: nothing to remove
    stripped = {**RENDERED, "webhooks": [{"name": "validate.gpu-stack.io"},
                                         {"name": "other.gpu-stack.io", "matchConditions": [{"name": "x"}]}]}
    assert ac.with_conditions(stripped, RENDERED) == [
        {"op": "add", "path": "/webhooks/0/matchConditions", "value": [{"name": "gpu", "expression": "true"}]},
        {"op": "remove", "path": "/webhooks/1/matchConditions"}]
    assert ac.conditions_of([RENDERED]) == {"validate.gpu-stack.io": 1, "other.gpu-stack.io": 0}


def _latency(round_: int, state: str, avg: float, failed: int = 0) -> ac.LatencyRun:
    return ac.LatencyRun(round=round_, state=state, latencies_ms=[avg] * 10, total=10 + failed)


def test_the_latency_target_is_the_median_ratio_of_the_rounds_and_every_create() -> None:
    runs = [_latency(1, ac.OFF, 100), _latency(1, ac.ON, 104), _latency(2, ac.OFF, 100), _latency(2, ac.ON, 120),
            _latency(3, ac.ON, 102), _latency(3, ac.OFF, 100), _latency(4, ac.ON, 500)]  # round 4: no off
    assert ac.latency_ratios(runs) == pytest.approx([1.04, 1.2, 1.02])
    assert ac.latency_verdict(runs) == (True, "")
    slow = [*runs[:4], _latency(3, ac.ON, 110), _latency(3, ac.OFF, 100)]
    assert ac.latency_verdict(slow) == (False, "median 1.10x > 1.05x")
    failing = [*runs[:2], _latency(2, ac.ON, 100, failed=1), _latency(2, ac.OFF, 100)]
    assert ac.latency_verdict(failing) == (False, "1 creates failed")
    assert ac.latency_verdict([]) == (False, "no round measured both")


def test_the_section_shows_both_configurations_side_by_side_per_1000_creates() -> None:
    m, v = ("mutate.gpu-stack.io", "admit"), ("validate.gpu-stack.io", "validating")
    calls = [ac.CallsRun(round=1, config=ac.BEFORE, creates=500, created=500, gpu_pods=50, calls={m: 500, v: 500}),
             ac.CallsRun(round=1, config=ac.AFTER, creates=500, created=499, gpu_pods=50, calls={m: 50, v: 50})]
    latency = [_latency(1, ac.OFF, 100), _latency(1, ac.ON, 103)]
    latency[0].apiserver_cpu_s, latency[1].apiserver_cpu_s = 0.03, 0.04  # 10 creates each
    text = ac.render(calls, latency, stamp="Run: 2026-01-01 00:00 UTC, commit abc, `make bench`.", command="make bench",
                     conditions={"mutate.gpu-stack.io": 2, "validate.gpu-stack.io": 2}, concurrency=20)
    assert text.startswith(ac.BEGIN) and text.rstrip().endswith(ac.END)
    assert "Run: 2026-01-01 00:00 UTC, commit abc, `make bench`." in text.splitlines()
    assert f"| {ac.BEFORE} | mutate.gpu-stack.io | admit | 1000 | 1000 | 0 |" in text
    assert f"| {ac.AFTER} | validate.gpu-stack.io | validating | 100 | 100 | 1 |" in text
    assert "50 of them (10%) asking for a GPU" in text
    assert "mutate.gpu-stack.io: 2, validate.gpu-stack.io: 2" in text
    assert (f"| 1 | {ac.CLOSED} | 100.0 / 100.0 / 100.0 | 103.0 / 103.0 / 103.0 | 1.03 | 3.00 / 4.00 | 0 | 0 "
            "| 0 |") in text
    assert (f"Target, {ac.CLOSED}: non-GPU creates with the webhook on within 5% of off (median over the "
            "rounds of avg(on) / avg(off): 1.03x): **met**.") in text


def test_on_is_judged_against_the_floor_where_it_was_measured_and_off_is_shown_beside() -> None:
    latency = [_latency(1, ac.OFF, 100), _latency(1, ac.ON, 120), _latency(1, ac.FLOOR, 115),
               _latency(2, ac.FLOOR, 110), _latency(2, ac.ON, 112), _latency(2, ac.OFF, 100)]
    for run, cpu in zip(latency, (0.03, 0.05, 0.045, 0.044, 0.05, 0.03), strict=True):
        run.apiserver_cpu_s = cpu
    latency[1].match_seconds, latency[2].match_seconds = 0.0045, 0.0025  # on, floor: 10 creates each
    latency[1].call_seconds = 0.012
    assert ac.latency_ratios(latency, ac.FLOOR) == pytest.approx([1.15, 1.1])
    assert ac.latency_ratios(latency, against=ac.FLOOR) == pytest.approx([120 / 115, 112 / 110])
    assert ac.latency_verdict(latency) == (True, "")  # 1.03x the floor, though 1.16x off
    slow = [*latency[:2], _latency(1, ac.FLOOR, 100)]
    assert ac.latency_verdict(slow) == (False, "median 1.20x > 1.05x")
    text = ac.render([], latency, stamp="", command="make bench", conditions={}, concurrency=20)
    assert ("| round | load | off: avg / p50 / p99 ms | on: avg / p50 / p99 ms | floor: avg / p50 / p99 ms "
            "| on / off (avg) | floor / off (avg) | on / floor (avg) | API server CPU ms per create, off / on / floor "
            "| matchConditions µs per create, on / floor | webhook calls µs per create, on | creates failed |") in text
    assert (f"| 1 | {ac.CLOSED} | 100.0 / 100.0 / 100.0 | 120.0 / 120.0 / 120.0 | 115.0 / 115.0 / 115.0 | 1.20 | 1.15 "
            "| 1.04 | 3.00 / 5.00 / 4.50 | 450 / 250 | 1200 | 0 |") in text
    assert (f"Target, {ac.CLOSED}: non-GPU creates with the webhook on within 5% of the matchConditions floor "
            "(median over the rounds of avg(on) / avg(floor): 1.03x): **met**.") in text
    assert "Against no webhook at all: on 1.16x, the floor 1.12x (medians)" in text


def test_one_non_gpu_create_in_20_names_a_sandbox_the_sandboxes_taking_turns() -> None:
    names = [ac.sandboxed_at(i) for i in range(1000)]
    assert sum(1 for n in names if n) == 50
    assert [n for n in names[:60] if n] == ["gvisor", "kata", "gvisor"]
    assert [i for i, n in enumerate(names[:60]) if n] == [19, 39, 59]
    assert sum(1 for n in names if n == "kata") == 25
    run = ac.LatencyRun(round=1, state=ac.ON, latencies_ms=[1.0], total=1, sandboxed_share=ac.SANDBOXED_SHARE)
    text = ac.render([], [run, ac.LatencyRun(round=1, state=ac.OFF, latencies_ms=[1.0], total=1)], stamp="",
                     command="make bench", conditions={}, concurrency=20)
    assert "5% of them with a sandboxed `runtimeClassName` (`gvisor` (handler runsc) and `kata` (handler kata)" in text


def test_each_load_is_judged_on_its_own_rounds() -> None:
    paced = ac.paced(50)
    latency = [_latency(1, ac.OFF, 100), _latency(1, ac.ON, 130),
               ac.LatencyRun(round=1, state=ac.OFF, load=paced, latencies_ms=[20.0] * 10, total=10),
               ac.LatencyRun(round=1, state=ac.ON, load=paced, latencies_ms=[20.6] * 10, total=11)]
    assert ac.loads_of(list(reversed(latency))) == [ac.CLOSED, paced]
    assert ac.latency_ratios(latency) == pytest.approx([1.3])
    assert ac.latency_ratios(latency, load=paced) == pytest.approx([1.03])
    assert ac.latency_verdict(latency) == (False, "median 1.30x > 1.05x")
    assert ac.latency_verdict(latency, paced) == (False, "1 creates failed")  # the paced on batch lost one
    text = ac.render([], latency, stamp="", command="make bench", conditions={}, concurrency=20)
    assert "| 1 | paced, 50 creates/s | 20.0 / 20.0 / 20.0 | 20.6 / 20.6 / 20.6 | 1.03 |" in text
    assert "Target, closed loop: " in text and "Target, paced, 50 creates/s: " in text
    assert "`paced, 50 creates/s`, creates sent at that rate whatever the answers" in text


def test_paced_arrivals_are_a_seeded_poisson_process() -> None:
    times = arrivals(20_000, 50.0, seed=25)
    assert times == arrivals(20_000, 50.0, seed=25) != arrivals(20_000, 50.0, seed=26)
    assert times == sorted(times) and times[0] > 0
    assert times[-1] / 20_000 == pytest.approx(1 / 50, rel=0.03)  # the mean gap is 1 / rate
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # P(gap > 3 / rate) = e^-3
    assert sum(g > 3 / 50 for g in gaps) / len(gaps) == pytest.approx(0.0498, abs=0.01)


def test_the_floor_patch_gives_every_webhook_one_false_condition() -> None:
    obj = {"webhooks": [{"name": "a", "matchConditions": [{"name": "x", "expression": "true"}]}, {"name": "b"}]}
    assert ac.floor_conditions(obj) == [
        {"op": "add", "path": f"/webhooks/{i}/matchConditions",
         "value": [{"name": "bench-floor", "expression": "false"}]} for i in (0, 1)]


def test_the_declared_sandboxes_are_a_state_of_their_own_judged_against_the_floor_too() -> None:
    latency = [_latency(1, ac.OFF, 100), _latency(1, ac.ON, 120), _latency(1, ac.DECLARED, 104),
               _latency(1, ac.FLOOR, 100)]
    latency[1].call_seconds, latency[2].call_seconds = 0.012, 0.0  # 10 creates each
    latency[1].sandboxed_share = ac.SANDBOXED_SHARE
    assert ac.latency_verdict(latency) == (False, "median 1.20x > 1.05x")
    assert ac.latency_verdict(latency, state=ac.DECLARED) == (True, "")
    text = ac.render([], latency, stamp="", command="make bench", conditions={}, concurrency=20)
    assert ("| off: avg / p50 / p99 ms | on: avg / p50 / p99 ms | declared: avg / p50 / p99 ms "
            "| floor: avg / p50 / p99 ms | on / off (avg) | declared / off (avg) | floor / off (avg) "
            "| on / floor (avg) | declared / floor (avg) | API server CPU ms per create, off / on / declared / floor "
            "| matchConditions µs per create, on / declared / floor | webhook calls µs per create, on / declared "
            "| creates failed |") in text
    assert "| 1.20 | 1.04 | 1.00 | 1.20 | 1.04 | 0.00 / 0.00 / 0.00 / 0.00 | 0 / 0 / 0 | 1200 / 0 | 0 |" in text
    assert (f"Target, {ac.CLOSED}, sandboxes declared: non-GPU creates with the webhook on and the sandboxes "
            "declared within 5% of the matchConditions floor (median over the rounds of avg(declared) / avg(floor): "
            "1.04x): **met**.") in text
    assert ("which the chart's matchConditions send to the webhook unless `webhook.policy.nonGpuRuntimeClassNames` "
            "names them (`declared`), the rest without one") in text
