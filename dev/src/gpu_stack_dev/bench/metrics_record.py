"""In-process micro-benchmark of `Metrics.record` (not part of the test suite, not run by `make bench`).

Records the reply of the 3-container GPU pod (bodies.gpu_pod_3c: 3 containers x 20 env vars) on /validate and on
/mutate (a patch, so one finding) in a loop and prints the median µs per record, in memory (tests, `check`)
and in multiprocess mode (the directory `serve` prepares for gunicorn), the path every review takes.

    .venv/bin/python bench/metrics_record.py [--rounds N] [--number N]
"""

from __future__ import annotations

import argparse
import statistics
import timeit

from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.admission.pipeline import Reply, answer
from gpu_stack_webhook.policy.config import parse_config
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.server import gunicorn_conf
from gpu_stack_webhook.server.metrics import Metrics

from gpu_stack_dev.bench.bodies import gpu_pod_3c


def replies() -> dict[Endpoint, Reply]:
    policy = Policy(parse_config({}))
    out = {}
    for endpoint in (Endpoint.VALIDATE, Endpoint.MUTATE):
        out[endpoint] = answer(endpoint, gpu_pod_3c(endpoint.value).data, policy)
        assert out[endpoint].status == 200, out[endpoint]
    return out


def median_us(metrics: Metrics, endpoint: Endpoint, reply: Reply, rounds: int, number: int) -> float:
    times = timeit.repeat(lambda: metrics.record(endpoint, reply, 0.0007), repeat=rounds, number=number)
    return statistics.median(times) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=20_000)
    args = parser.parse_args()
    by_endpoint = replies()
    for endpoint, reply in by_endpoint.items():
        findings = len(list(reply.decision.severities())) if reply.decision else 0
        print(f"{endpoint.value}: outcome {reply.outcome}, {findings} finding(s)")
    memory = Metrics()
    for endpoint, reply in by_endpoint.items():
        us = median_us(memory, endpoint, reply, args.rounds, args.number)
        print(f"in memory     {endpoint.value:8} {us:6.2f} µs/record")
    path = gunicorn_conf.prepare_metrics_dir()
    try:
        multiprocess = Metrics(path)
        for endpoint, reply in by_endpoint.items():
            us = median_us(multiprocess, endpoint, reply, args.rounds, args.number)
            print(f"multiprocess  {endpoint.value:8} {us:6.2f} µs/record")
        multiprocess.render()
    finally:
        gunicorn_conf.remove_metrics_dir()


if __name__ == "__main__":
    main()
