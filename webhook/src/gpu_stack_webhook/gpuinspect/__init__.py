"""`gpu-stack-webhook inspect` and `kubectl gpu-stack inspect`: the cluster's GPUs, read (fetch.py, through the
one Kubernetes adapter, kube/client.py), modelled without I/O (model.py with dra.py and dashboards.py; the
records and their versioned JSON shape in records.py) and printed (render.py); command.py parses the
arguments and ties them together."""
