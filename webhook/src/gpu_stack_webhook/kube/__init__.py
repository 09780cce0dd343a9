"""kube layer: the one Kubernetes adapter and client construction (client.py), the policy's cached lookups
(lookups.py), and inspect's paged reads (inspect.py)."""
