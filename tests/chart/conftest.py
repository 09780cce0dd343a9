from __future__ import annotations

import pytest
from gpu_stack_dev.chartlib import HELM_MAJORS, helm_path


@pytest.fixture(scope="session", params=HELM_MAJORS, ids=[f"helm{m}" for m in HELM_MAJORS])
def helm(request: pytest.FixtureRequest) -> int:
    """The Helm major version under test; resolves (and on first use downloads) the real binary."""
    helm_path(request.param)
    return int(request.param)
