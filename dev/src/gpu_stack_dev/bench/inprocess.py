"""In-process timings of the policy (no HTTP): review sizes, rules enabled, distinct patches."""

from __future__ import annotations

import functools
import json
import statistics
import timeit
from collections.abc import Callable
from typing import Any

import yaml
from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.admission.pipeline import answer
from gpu_stack_webhook.policy.config import PolicyConfig, parse_config
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.policy.rules import RULES

from gpu_stack_dev.bench import bodies

SIZES = (1, 10, 50, 200)

def _median_us(fn: Callable[[], object], number: int, rounds: int = 7) -> float:
    return statistics.median(timeit.repeat(fn, number=number, repeat=rounds)) / number * 1e6

def _validate_body(data: bytes, policy: Policy) -> bytes:
    return answer(Endpoint.VALIDATE, data, policy).body


def inprocess_sizes(number: int) -> list[dict[str, Any]]:
    policy = Policy(PolicyConfig())
    rows = []
    for n in SIZES:
        review = bodies.scaled_pod("validate", n)
        data = json.dumps(review, separators=(",", ":")).encode()
        obj = review["request"]["object"]
        reps = max(3, number // n)
        evaluate = _median_us(functools.partial(policy.evaluate, obj, "Pod"), reps)
        parse = _median_us(functools.partial(json.loads, data), reps)
        full = _median_us(functools.partial(_validate_body, data, policy), reps)
        rows.append({"containers": n, "bytes": len(data), "evaluate_us": evaluate, "json_loads_us": parse,
                     "review_us": full})
    return rows

def rules_config(enabled: int) -> dict[str, Any]:
    return {"rules": {"disabled": [r.id for r in RULES[enabled:]]}}

def inprocess_rules(number: int) -> list[dict[str, Any]]:
    mix = [json.loads(b.data) for b in bodies.mix("validate")]
    objects = [(m["request"]["object"], m["request"]["kind"]["kind"]) for m in mix]
    rows = []
    for k in range(1, len(RULES) + 1):
        policy = Policy(parse_config(rules_config(k)))

        def evaluate(policy: Policy = policy) -> None:
            for obj, kind in objects:
                policy.evaluate(obj, kind)

        rows.append({"rules": k, "ids": [r.id for r in RULES[:k]],
                     "evaluate_us": _median_us(evaluate, max(3, number // 5)) / len(objects)})
    return rows

def distinct_patches(mutate: list[bodies.Body], policy_text: str) -> int:
    """How many different JSONPatches the webhook answers over the /mutate bodies (in-process): the
    fewer, the more often its diff memo and last-encoded-patch cache hit in the mix."""
    policy = Policy(parse_config(yaml.safe_load(policy_text) or {}))
    patches = set()
    for body in mutate:
        response = json.loads(answer(Endpoint.MUTATE, bodies.stamp(body.data, 1), policy).body)["response"]
        if "patch" in response:
            patches.add(response["patch"])
    return len(patches)
