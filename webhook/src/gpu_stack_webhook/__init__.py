"""gpu-stack admission webhook: keeps GPU pods honest."""

__version__ = "0.1.0"
