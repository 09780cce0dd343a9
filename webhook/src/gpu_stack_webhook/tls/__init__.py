"""tls layer: everything TLS, which server/ only wires in: the serving context (serving.py: TLS 1.2 floor, the
pair checked before binding, a renewed certificate picked up), certificates (certs.py) and the self-managed
lifecycle, split into its pure plan (config.py, material.py, plan.py), its side effects through the kube
adapter (selfmanaged.py, files.py) and its start before gunicorn binds (startup.py)."""
