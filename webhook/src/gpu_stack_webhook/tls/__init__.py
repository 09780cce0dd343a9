"""tls layer: certificates (certs.py) and the self-managed lifecycle, split into its pure plan (config.py,
material.py, plan.py) and its side effects through the kube adapter (selfmanaged.py, files.py)."""
