#!/usr/bin/env python3
"""Scale on a real scheduler: a fleet of GPU nodes published as the chart's agents
would (gpu_stack_dev.e2e.fleet, the `per-node-configs` overlay), then GPU pods written as README.md tells users
to write them, created through the `make e2e` API server with the webhook on (the chart's configurations
pointed at `gpu-stack-webhook serve` on loopback) and off (no configurations); the time from the first
create until every pod is bound or reported unschedulable by kube-scheduler, side by side in one run.

The command; the code is gpu_stack_dev.bench.scheduler_scale."""

import sys

from gpu_stack_dev.bench.scheduler_scale import main

if __name__ == "__main__":
    sys.exit(main())
