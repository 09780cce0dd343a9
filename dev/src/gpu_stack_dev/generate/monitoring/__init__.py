"""The chart's monitoring as code: alert rules (alerts.py), the DCGM fields they and the dashboards read
(counters.py), the idle allocated GPU signal both use (idle.py) and the Grafana dashboards (dashboards.py),
generated into charts/gpu-stack/files/monitoring/ by `make generate` (gpu_stack_dev.generate lists every file;
tests/test_generated.py fails when one is stale).

The generated files hold placeholders the chart's templates replace at render time (placeholders.py): the
scrape jobs, the release namespace and numbers that follow other values (the webhook's timeout, the idle-GPU
thresholds).
"""
