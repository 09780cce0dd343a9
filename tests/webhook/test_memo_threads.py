"""The review path's module-level memos are right under gunicorn gthread's threads.

Two pure modules keep memos shared by every thread of a worker: admission/review.py the last patch it
encoded (one entry, by identity) and policy/desired.py jsonpatch's diffs and JSON pointer tokens (LRU
caches of 1,024 and 4,096 entries). Here several threads answer different reviews at once, in random
order, with the interpreter switching threads as often as it can, and every answer must be the bytes
the same review gets alone. No timing is measured.
"""

from __future__ import annotations

import base64
import random
import sys
import threading
from collections.abc import Callable, Iterator

import orjson
import pytest
from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.admission.pipeline import answer
from gpu_stack_webhook.admission.review import build_response
from gpu_stack_webhook.policy.engine import Policy

from .podlib import GPU, container, make_pod, review
from .policylib import config_mps

THREADS = 8
ROUNDS = 400


@pytest.fixture(autouse=True)
def _switch_threads_often() -> Iterator[None]:
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def run_threads(work: Callable[[random.Random], None]) -> None:
    """`work` in THREADS threads started together, each with its own seeded random order; re-raises."""
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def run(seed: int) -> None:
        try:
            barrier.wait()
            work(random.Random(seed))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]


def test_each_thread_gets_its_own_patch_encoded() -> None:
    patches = [tuple({"op": "add", "path": f"/spec/p{i}", "value": "x" * i} for _ in range(1 + i % 3))
               for i in range(6)]
    patches.append(tuple(dict(op) for op in patches[0]))  # equal to another, a different object
    expected = {id(p): base64.b64encode(orjson.dumps(list(p))).decode() for p in patches}

    def work(rng: random.Random) -> None:
        for _ in range(ROUNDS * 4):
            patch = rng.choice(patches)
            encoded = build_response("u", True, patch=patch)["response"]["patch"]
            assert encoded == expected[id(patch)], (patch, base64.b64decode(encoded))

    run_threads(work)


def _reviews() -> list[bytes]:
    """Reviews whose answers differ: patches of several shapes (limit fill, MPS injection), a denial,
    an allowed pod without a patch; each body twice over (the same pod as another object)."""
    pods = [
        make_pod([container("a", requests={GPU: 1})]),
        make_pod([container("a", requests={GPU: 2}), container("b", requests={GPU: 1})]),
        make_pod([container("a", gpu=1)], annotations={"gpu-stack.io/mps": "true"}),
        make_pod([container("a", requests={GPU: 1})], annotations={"gpu-stack.io/mps": "true"}),
        make_pod([container("a", gpu=1)], nodeSelector={"nvidia.com/mps.capable": "true"}),
        make_pod([container("a", requests={GPU: 1}, limits={GPU: 2})]),
        make_pod([container("a")]),
    ]
    return [orjson.dumps(review(pod, uid=f"uid-{i}")) for i, pod in enumerate(pods)]


@pytest.mark.parametrize("endpoint", [Endpoint.MUTATE, Endpoint.VALIDATE])
def test_concurrent_reviews_get_the_bytes_each_gets_alone(endpoint: Endpoint) -> None:
    policy = Policy(config_mps())
    bodies = _reviews()
    alone = [answer(endpoint, body, policy).body for body in bodies]
    if endpoint is Endpoint.MUTATE:
        assert len({orjson.loads(a)["response"].get("patch") for a in alone}) >= 5, "patches of several shapes"

    def work(rng: random.Random) -> None:
        for _ in range(ROUNDS):
            index = rng.randrange(len(bodies))
            assert answer(endpoint, bodies[index], policy).body == alone[index], index

    run_threads(work)
