"""The package's build: setuptools, with the review path compiled to C by mypyc.

Every admission review runs these modules (the pod view, the rules, the engine, the AdmissionReview
codec and the request path); compiled they take about half the CPU they take interpreted
(BENCHMARKS.md). mypyc compiles the typed Python as written: the source stays the one truth, mypy
checks it strictly, and the same modules run interpreted when built with GPU_STACK_WEBHOOK_PURE_PYTHON=1
(for a debugger or a line profiler; `make test` and the image run the compiled build).
"""

from __future__ import annotations

import os

from mypyc.build import mypycify
from setuptools import setup

# Paths under src/gpu_stack_webhook/. Not policy/config.py: its pydantic models are Python classes.
# server/metrics.py and metric_values.py: every review is counted through them.
COMPILED = [
    "admission/decide.py",
    "admission/pipeline.py",
    "admission/review.py",
    "policy/desired.py",
    "policy/engine.py",
    "policy/findings.py",
    "policy/pod.py",
    "policy/quantity.py",
    "policy/sharing.py",
    "policy/rules/__init__.py",
    "policy/rules/base.py",
    "policy/rules/device_bypass.py",
    "policy/rules/gpu_limits.py",
    "policy/rules/mig_resources.py",
    "policy/rules/mps.py",
    "policy/rules/privileged.py",
    "policy/rules/runtime_class.py",
    "policy/rules/shared_requests.py",
    "policy/rules/visible_devices.py",
    "server/decision_log.py",
    "server/metric_values.py",
    "server/metrics.py",
    "server/reloader.py",
    "server/review_routes.py",
]


def ext_modules() -> list[object]:
    if os.environ.get("GPU_STACK_WEBHOOK_PURE_PYTHON") == "1":
        return []
    # This directory's mypy configuration, not the repository's (the image is built from this directory).
    options = ["--config-file", os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyproject.toml")]
    return mypycify([*options, *(f"src/gpu_stack_webhook/{path}" for path in COMPILED)], opt_level="3")


setup(ext_modules=ext_modules())
