"""Hypothesis profiles for the property tests, and a count of the cases each property ran.

HYPOTHESIS_PROFILE selects the profile:
- `ci` (default, what `make test` runs): 100 examples per property, derandomized (the same examples on
  every run, so CI never flakes on a newly found case), no deadline.
- `fuzz` (`make fuzz`): 20,000 random examples per property (>= 100,000 in total over the properties),
  printed per property and in total at the end of the run. FUZZ_EXAMPLES overrides the per-property count.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from . import counting

_SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile(
    "ci", max_examples=100, deadline=None, derandomize=True, database=None, print_blob=True,
    suppress_health_check=_SLOW,
)
settings.register_profile(
    "fuzz", max_examples=int(os.environ.get("FUZZ_EXAMPLES", "20000")), deadline=None, derandomize=False,
    print_blob=True, suppress_health_check=_SLOW,
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)

CASES_KEY = "hypothesis-cases"


@pytest.fixture(autouse=True)
def _count_cases(request: pytest.FixtureRequest) -> Iterator[None]:
    counting.reset()
    yield
    request.node.user_properties.append((CASES_KEY, counting.value()))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    counts: dict[str, int] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "teardown":
                continue
            for key, value in getattr(report, "user_properties", ()):
                if key == CASES_KEY and value:
                    counts[report.nodeid] = value
    if not counts:
        return
    terminalreporter.section(f"hypothesis cases run (profile {PROFILE})")
    for nodeid, value in sorted(counts.items()):
        terminalreporter.write_line(f"{value:>9,}  {nodeid}")
    terminalreporter.write_line(f"{sum(counts.values()):>9,}  total over {len(counts)} properties")
