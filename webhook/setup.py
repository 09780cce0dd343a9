"""The package's build: setuptools, with the review path compiled to C by mypyc.

Every admission review runs these modules (the pod view, the rules, the engine, the AdmissionReview
codec and the request path); compiled they take about half the CPU they take interpreted
(BENCHMARKS.md). mypyc compiles the typed Python as written: the source stays the one truth, mypy
checks it strictly, and the same modules run interpreted when built with GPU_STACK_WEBHOOK_PURE_PYTHON=1
(for a debugger or a line profiler; the image runs the compiled build, `make test` the compiled build and
then the policy and admission tests on the interpreted one, `make test-interpreted`).

Every build records which sources it was made from (gpu_stack_webhook/build-record.json, written by
build_source.py beside the built modules), so the test session can refuse a build of other sources.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from mypyc.build import mypycify
from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PURE_PYTHON = os.environ.get("GPU_STACK_WEBHOOK_PURE_PYTHON") == "1"

# Paths under src/gpu_stack_webhook/, and every rule module (RULE_MODULES: a new rule joins the build by being
# there). Not policy/config.py: its pydantic models are Python classes.
# server/metrics.py and metric_values.py: every review is counted through them.
COMPILED = [
    "admission/decide.py",
    "admission/pipeline.py",
    "admission/review.py",
    "policy/context.py",
    "policy/desired.py",
    "policy/dra.py",
    "policy/engine.py",
    "policy/findings.py",
    "policy/gpus.py",
    "policy/pod.py",
    "policy/quantity.py",
    "policy/sharing.py",
    "policy/signals.py",
    "server/decision_log.py",
    "server/metric_values.py",
    "server/metrics.py",
    "server/reloader.py",
    "server/review_routes.py",
]

RULE_MODULES = sorted(p.relative_to(HERE / "src" / "gpu_stack_webhook").as_posix()
                      for p in (HERE / "src" / "gpu_stack_webhook" / "policy" / "rules").glob("*.py"))


def ext_modules() -> list[object]:
    if PURE_PYTHON:
        return []
    # This directory's mypy configuration, not the repository's (the image is built from this directory).
    options = ["--config-file", os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyproject.toml")]
    paths = [f"src/gpu_stack_webhook/{path}" for path in (*COMPILED, *RULE_MODULES)]
    return mypycify([*options, *paths], opt_level="3")


class BuildPyWithRecord(build_py):
    """build_py, then the record of the sources this build is made from (build_source.py)."""

    def run(self) -> None:
        super().run()
        spec = importlib.util.spec_from_file_location("_gpu_stack_build_source",
                                                      HERE / "src" / "gpu_stack_webhook" / "build_source.py")
        assert spec is not None and spec.loader is not None
        build_source = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(build_source)
        target = Path(self.build_lib) / "gpu_stack_webhook" / build_source.BUILD_RECORD
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(build_source.record(HERE, compiled=not PURE_PYTHON), encoding="utf-8")


setup(ext_modules=ext_modules(), cmdclass={"build_py": BuildPyWithRecord})
