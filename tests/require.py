"""The one switch for "this run must prove it": GPU_STACK_REQUIRE_REAL=1 (set by .ci/run for `make test` and
`make e2e`, and by the Makefile's e2e target where a real node can run). A test whose real part (a binary of
../shared/gpu-node, root, the real node, the GPU Operator build, buildah) cannot start here calls `skip_or_fail`:
with the switch it fails, naming what is missing; without it, it skips with that reason, which pytest prints in
its summary (`-ra`, pyproject.toml). GPU_STACK_E2E_REQUIRE_NODE=1, the switch's earlier name, is its alias."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REQUIRE_REAL = "GPU_STACK_REQUIRE_REAL"
ALIASES = ("GPU_STACK_E2E_REQUIRE_NODE",)


def required() -> bool:
    """Whether this run must run every real part (the switch, or its alias, is 1)."""
    return any(os.environ.get(name) == "1" for name in (REQUIRE_REAL, *ALIASES))


def skip_or_fail(reason: str) -> NoReturn:
    """Fail where the run must prove it, else skip; the reason is printed either way."""
    if required():
        pytest.fail(f"{REQUIRE_REAL}=1 and this test's real part cannot run here: {reason}", pytrace=False)
    pytest.skip(reason)

