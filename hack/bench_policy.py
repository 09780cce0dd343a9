#!/usr/bin/env python3
"""In-process micro-benchmark of the policy core (not part of the test suite).

Prints the median time of one policy evaluation for a 3-container GPU pod (target: < 100 µs),
and of a full review (parse + evaluate + response) for /mutate and /validate, with the ratio of the
review to the bare evaluation measured side by side in this run.

    make bench        # or: .venv/bin/python hack/bench_policy.py [--rounds N]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import timeit

from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.admission.pipeline import answer
from gpu_stack_webhook.admission.requests import admission_review
from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.engine import Policy


def three_container_gpu_pod() -> dict:
    def container(name: str, gpus: int) -> dict:
        return {
            "name": name,
            "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
            "env": [{"name": f"VAR_{i}", "value": str(i)} for i in range(10)],
            "resources": {"limits": {"nvidia.com/gpu": str(gpus), "cpu": "2"},
                          "requests": {"nvidia.com/gpu": str(gpus), "cpu": "1"}},
            "securityContext": {"allowPrivilegeEscalation": False},
        }

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bench", "namespace": "ml"},
        "spec": {
            "containers": [container("trainer", 1), container("sidecar", 0)],
            "initContainers": [container("warmup", 1)],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 300}],
        },
    }


def median_us(fn, rounds: int, number: int) -> float:
    times = timeit.repeat(fn, repeat=rounds, number=number)
    return statistics.median(times) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--number", type=int, default=400)
    args = parser.parse_args()

    policy = Policy(PolicyConfig())
    pod = three_container_gpu_pod()
    body = json.dumps(admission_review(pod, uid="0b1c8f7e-bench")).encode()

    def evaluate() -> None:
        policy.evaluate(pod, "Pod", can_patch=True)

    def full_review(endpoint: Endpoint):
        def run() -> None:
            answer(endpoint, body, policy)  # the server's own path: bytes in, bytes out
        return run

    mps_pod = copy.deepcopy(pod)
    mps_pod["metadata"]["annotations"] = {"gpu-stack.io/mps": "true"}

    def evaluate_mps() -> None:
        policy.evaluate(mps_pod, "Pod", can_patch=True)

    rows = [
        ("evaluate 3-container GPU pod", median_us(evaluate, args.rounds, args.number)),
        ("evaluate 3-container MPS pod (patched)", median_us(evaluate_mps, args.rounds, args.number)),
        ("review /mutate (parse+evaluate+respond)", median_us(full_review(Endpoint.MUTATE), args.rounds, args.number)),
        ("review /validate (parse+evaluate+respond)", median_us(full_review(Endpoint.VALIDATE), args.rounds,
                                                                args.number)),
    ]
    base = rows[0][1]
    print(f"policy core micro-benchmark — {platform.python_implementation()} {platform.python_version()}, "
          f"{platform.machine()}, median of {args.rounds} rounds x {args.number} calls")
    print(f"{'case':45} {'median µs':>10} {'x evaluate':>11}")
    for name, us in rows:
        print(f"{name:45} {us:10.1f} {us / base:11.2f}")
    target = 100.0
    verdict = "meets" if base < target else "MISSES"
    print(f"target: 3-container GPU pod evaluation under {target:.0f} µs median: {verdict} ({base:.1f} µs)")


if __name__ == "__main__":
    main()
