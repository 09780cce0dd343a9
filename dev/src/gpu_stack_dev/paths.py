"""Where the checkout's files are. The dev package is installed editable (Makefile: $(DEV_STAMP)), so its
sources stay in the checkout: dev/src/gpu_stack_dev/paths.py is three levels below the repository root."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "gpu-stack"
EXAMPLES = ROOT / "Chart-values-examples"
HACK = ROOT / "hack"
BENCH = ROOT / "bench"
# `helm template` here renders as for a cluster that serves DRA's resource.k8s.io/v1 (Kubernetes >= 1.34):
# without it the chart refuses dra.enabled (templates/validate.yaml; Helm's default API list names no kinds).
# Checks that are about an older cluster render without it (tests/chart/test_kubernetes_versions.py).
TEMPLATE_API_VERSIONS = ("--api-versions", "resource.k8s.io/v1/DeviceClass")
