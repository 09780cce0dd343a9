"""NVIDIA's binaries and mock NVML from ../shared/gpu-node, for tests that run them outside a node: a skip where the
folder is not beside the checkout, a failure where the run requires it (GPU_STACK_E2E_REQUIRE_NODE=1, as `make e2e`
and CI set)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from gpu_stack_dev.e2e import mock_gpu


def unpacked_or_skip() -> Path:
    try:
        return mock_gpu.unpacked()
    except FileNotFoundError as exc:
        if os.environ.get("GPU_STACK_E2E_REQUIRE_NODE") == "1":
            pytest.fail(str(exc))
        pytest.skip(str(exc))
