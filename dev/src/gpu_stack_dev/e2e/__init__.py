"""The end-to-end harness: a cluster with kubectl and Helm (e2elib), the chart installed and served over TLS,
simulated GPU fleets (fleet, dra_fleet), the webhook run as its pod would run it (podrun), load through the
API server (apiload) and the chart on the real node (node_install)."""
