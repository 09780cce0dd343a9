"""Where the checkout's files are. The dev package is installed editable (Makefile: $(DEV_STAMP)), so its
sources stay in the checkout: dev/src/gpu_stack_dev/paths.py is three levels below the repository root."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "gpu-stack"
EXAMPLES = ROOT / "Chart-values-examples"
HACK = ROOT / "hack"
BENCH = ROOT / "bench"
