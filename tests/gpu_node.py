"""NVIDIA's binaries and mock NVML from ../shared/gpu-node, for tests that run them outside a node: a skip where the
folder is not beside the checkout, a failure where the run requires it (tests/require.py: GPU_STACK_REQUIRE_REAL=1,
as .ci/run and `make e2e` set)."""

from __future__ import annotations

from pathlib import Path

from gpu_stack_dev.e2e import mock_gpu

from tests.require import skip_or_fail


def unpacked_or_skip() -> Path:
    try:
        return mock_gpu.unpacked()
    except FileNotFoundError as exc:
        skip_or_fail(str(exc))
