"""gpu-stack's development machinery, shared by tests/, bench/, hack/ and the demo (dev/pyproject.toml)."""
