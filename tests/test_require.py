"""The one switch (tests/require.py): a test whose real part cannot start skips with its reason on a laptop and
fails with it where the run must prove it (GPU_STACK_REQUIRE_REAL=1, or its alias GPU_STACK_E2E_REQUIRE_NODE=1)."""

from __future__ import annotations

import pytest

from tests.require import ALIASES, REQUIRE_REAL, skip_or_fail

REASON = "../shared/gpu-node is not beside the checkout"


@pytest.fixture
def unset(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (REQUIRE_REAL, *ALIASES):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_without_the_switch_it_skips_with_the_reason(unset: pytest.MonkeyPatch) -> None:
    with pytest.raises(pytest.skip.Exception, match=REASON):
        skip_or_fail(REASON)


@pytest.mark.parametrize("name", [REQUIRE_REAL, *ALIASES])
def test_with_the_switch_it_fails_with_the_reason(unset: pytest.MonkeyPatch, name: str) -> None:
    unset.setenv(name, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_REAL}=1 .*{REASON}"):
        skip_or_fail(REASON)


def test_another_value_is_not_the_switch(unset: pytest.MonkeyPatch) -> None:
    unset.setenv(REQUIRE_REAL, "true")
    with pytest.raises(pytest.skip.Exception):
        skip_or_fail(REASON)
