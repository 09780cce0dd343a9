"""kube layer: the one Kubernetes adapter (client.py) over the client connect.py builds, the policy's cached
lookups (lookups.py) and the live configuration readers (live.py)."""
