"""The bookkeeping of bench/apiserver_load.py (gpu_stack_dev.bench.apiserver_rounds): rotation order, per-round
ratios, their median and worst, the verdict and the rendered section. No cluster, no timing."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import pytest
from gpu_stack_dev.bench import apiserver_rounds as ar
from gpu_stack_dev.bench import baseline_app


def run(round_: int, target: str, avg: float, concurrency: int = 50, *, p99: float | None = None,
        created: int = 10, total: int = 10) -> ar.Run:
    # `created` latencies, all equal to avg except the last one, which is the p99/max when given.
    latencies = [avg] * created
    if p99 is not None and created:
        latencies[-1] = p99
        latencies[0] = 2 * avg - p99 if created > 1 else p99  # keeps the mean at avg
    failures = Counter({"HTTP 500: context deadline exceeded": total - created}) if total > created else Counter()
    return ar.Run(round=round_, position=1, target=target, concurrency=concurrency, total=total,
                  latencies_ms=latencies, failures=failures, seconds=1.0)


def test_every_target_takes_every_position_once_over_as_many_rounds() -> None:
    targets = ar.TARGETS
    orders = [ar.rotation(targets, i) for i in range(len(targets))]
    assert orders[0] == list(targets)
    assert orders[1] == [ar.BARE, ar.BARE_ANSWERS, ar.OURS, ar.NONE]
    for order in orders:
        assert sorted(order) == sorted(targets)
    for position in range(len(targets)):
        assert sorted(order[position] for order in orders) == sorted(targets)
    assert ar.rotation(targets, len(targets)) == orders[0]  # round 5 starts over
    assert ar.rotation(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert ar.rotation([], 3) == []


def test_ratios_pair_the_runs_of_the_same_round_and_concurrency() -> None:
    runs = [run(1, ar.OURS, 120), run(1, ar.BARE, 100), run(2, ar.OURS, 150), run(2, ar.BARE, 100),
            run(3, ar.OURS, 90), run(3, ar.BARE, 100),
            run(1, ar.OURS, 500, 100), run(1, ar.BARE, 100, 100),  # other concurrency: not mixed in
            run(4, ar.OURS, 999)]  # no bare run in round 4: no ratio
    assert ar.round_ratios(runs, ar.OURS, ar.BARE, 50) == pytest.approx([1.2, 1.5, 0.9])
    s = ar.summarize(runs, ar.OURS, ar.BARE, 50)
    assert s.median == pytest.approx(1.2)
    assert s.worst == pytest.approx(1.5)
    assert s.best == pytest.approx(0.9)
    assert ar.summarize(runs, ar.OURS, ar.BARE, 100).ratios == pytest.approx((5.0,))
    assert ar.summarize(runs, ar.OURS, ar.NONE, 50).ratios == ()


def test_median_of_an_even_number_of_rounds_is_the_mean_of_the_middle_two() -> None:
    runs = [r for i, x in enumerate([110, 130, 100, 160], 1) for r in (run(i, ar.OURS, x), run(i, ar.BARE, 100))]
    assert ar.summarize(runs, ar.OURS, ar.BARE, 50).median == pytest.approx(1.2)


def test_run_statistics() -> None:
    r = ar.Run(round=1, position=1, target=ar.OURS, concurrency=50, total=5,
               latencies_ms=[50.0, 10.0, 40.0, 20.0, 30.0], seconds=2.0)
    assert (r.created, r.rate, r.avg_ms, r.max_ms) == (5, 2.5, 30.0, 50.0)
    assert (r.percentile_ms(50), r.percentile_ms(99), r.percentile_ms(0)) == (30.0, 50.0, 10.0)
    empty = ar.Run(round=1, position=1, target=ar.OURS, concurrency=50, total=5)
    assert (empty.created, empty.rate, empty.avg_ms, empty.percentile_ms(99), empty.max_ms) == (0, 0.0, 0.0, 0.0, 0.0)


def test_verdict_needs_every_create_a_fast_p99_and_the_median_ratio() -> None:
    good = [run(i, t, avg, c, p99=avg * 2) for i in (1, 2, 3) for c in (50, 100)
            for t, avg in ((ar.BARE, 200.0), (ar.OURS, 240.0))]
    assert ar.verdict(good, [50, 100]) == (True, [])

    one_bad_round = [*good[:-1], run(3, ar.OURS, 400.0, 100, p99=800.0)]  # ratio 2.0 in one round only
    assert ar.verdict(one_bad_round, [50, 100])[0] is True  # the median decides, the worst is reported

    slow = [*good[:-1], run(3, ar.OURS, 240.0, 100, p99=1200.0)]
    met, why = ar.verdict(slow, [50, 100])
    assert not met and why == ["100 in flight: p99 >= 1000 ms in 1 of 3 runs"]
    machine = [*slow, run(1, ar.NONE, 240.0, 100, p99=1100.0), run(2, ar.NONE, 240.0, 100, p99=900.0)]
    assert ar.verdict(machine, [100])[1] == ["100 in flight: p99 >= 1000 ms in 1 of 3 runs "
                                             "(with no webhook at all: 1 of 2)"]

    failing = [*good[:-1], run(3, ar.OURS, 240.0, 100, created=9, total=10)]
    assert ar.verdict(failing, [50, 100]) == (False, ["100 in flight: 1 creates failed"])

    too_slow = [r if r.target != ar.OURS or r.concurrency != 50 else run(r.round, ar.OURS, 260.0, 50)
                for r in good]  # 1.30x in every round
    assert ar.verdict(too_slow, [50, 100]) == (False, ["50 in flight: median ratio 1.30x > 1.25x"])

    assert ar.verdict([r for r in good if r.target != ar.OURS], [50])[1] == [f"50 in flight: no run of {ar.OURS}"]


def test_the_section_shows_per_round_ratios_median_worst_load_and_the_verdict() -> None:
    runs = []
    for i, bare_avg in enumerate((100.0, 120.0, 110.0), 1):
        for position, target in enumerate(ar.rotation(ar.TARGETS, i - 1), 1):
            avg = {ar.NONE: 90.0, ar.BARE: bare_avg, ar.BARE_ANSWERS: 1.1 * bare_avg, ar.OURS: 1.2 * bare_avg}[target]
            r = run(i, target, avg, p99=300.0)
            r.position, r.load1 = position, 1.5 + i
            runs.append(r)
    text = ar.render(runs, command="bench/apiserver_load.py --rounds 3", creates=10, rounds=3, concurrencies=[50],
                     targets=ar.TARGETS, notes=["a note"])
    assert text.startswith(ar.BEGIN) and text.rstrip().endswith(ar.END)
    assert "Generated by `bench/apiserver_load.py --rounds 3`" in text
    assert "Load average of the machine at the start of the runs: 2.5-4.5." in text
    ours_vs_bare = next(line for line in text.splitlines() if line.startswith(f"| 50 | {ar.OURS} / {ar.BARE} ("))
    assert ours_vs_bare.endswith("| 1.20, 1.20, 1.20 | 1.20x | 1.20x |")
    answers = next(line for line in text.splitlines() if line.startswith(f"| 50 | {ar.BARE_ANSWERS} / {ar.BARE} ("))
    assert answers.endswith("| 1.10, 1.10, 1.10 | 1.10x | 1.10x |")
    assert "**met**" in text
    assert "* a note" in text
    every_run = text.split("<summary>Every run</summary>", 1)[1]
    assert every_run.count(f"| {ar.OURS} |") == 3
    assert "| 3 | 1 | 50 | bare, our answers | 4.5 |" in every_run  # round 3 starts with the third target


def test_the_answering_baseline_adds_the_given_fields_to_mutate_only() -> None:
    body = json.dumps({"request": {"uid": "u-1"}}).encode()
    answer = {"patchType": "JSONPatch", "patch": "W10=", "warnings": ["w"]}
    baseline_app.MUTATE_ANSWER.update(answer)
    try:
        replies = {}
        for path in ("/mutate", "/validate"):
            environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "CONTENT_LENGTH": str(len(body)),
                       "wsgi.input": io.BytesIO(body)}
            replies[path] = json.loads(b"".join(baseline_app.app(environ, lambda *_: None)))["response"]
    finally:
        baseline_app.MUTATE_ANSWER.clear()
    assert replies["/mutate"] == {"uid": "u-1", "allowed": True, **answer}
    assert replies["/validate"] == {"uid": "u-1", "allowed": True}


def test_cpu_ratios_and_saved_runs(tmp_path: Path) -> None:
    runs = []
    for i, (ours_cpu, bare_cpu) in enumerate(((6.0, 5.0), (5.5, 5.0), (7.5, 5.0)), 1):
        for target, cpu in ((ar.OURS, ours_cpu), (ar.BARE, bare_cpu)):
            r = run(i, target, 100.0)
            r.apiserver_cpu_ms, r.etcd_cpu_ms, r.webhook_cpu_ms = cpu - 1.5, 0.5, 1.0
            r.failures = Counter({"HTTP 500: x": 1})
            runs.append(r)
    s = ar.summarize(runs, ar.OURS, ar.BARE, 50, ar.cpu_per_pod)
    assert s.ratios == pytest.approx((1.2, 1.1, 1.5))
    assert (s.median, s.worst) == pytest.approx((1.2, 1.5))
    ar.save(runs, tmp_path / "runs.json", {"command": "c", "creates": 10})
    assert ar.load(tmp_path / "runs.json") == (runs, {"command": "c", "creates": 10})
    text = ar.render(runs, command="c", creates=10, rounds=3, concurrencies=[50], targets=[ar.BARE, ar.OURS])
    assert f"| 50 | {ar.OURS} / {ar.BARE} (" in text
    assert "| CPU per pod | 1.20, 1.10, 1.50 | 1.20x | 1.50x |" in text
