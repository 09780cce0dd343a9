"""GPU004 shared-gpu-single-request: no request above one for a shared GPU that refuses it.

With time-slicing or MPS a request for more than one replica does not give more compute, and with
`failRequestsGreaterThanOne` (always, for MPS) the device plugin fails such a pod on the node, where
it sits in UnexpectedAdmissionError. Denied when every config the pod could land on refuses it;
a warning when only some do.
"""

from __future__ import annotations

from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.findings import Finding, Severity
from gpu_stack_webhook.policy.gpus import candidate_configs, gpu_amounts
from gpu_stack_webhook.policy.pod import PodView, format_count
from gpu_stack_webhook.policy.signals import Signal

ID = "GPU004"
NAME = "shared-gpu-single-request"
# The rule's row of docs/policy-rules.md (markdown; `make generate` writes the table).
DOC = (
    'no request above 1 for a time-sliced or MPS-shared resource whose config fails such requests '
    '(`failRequestsGreaterThanOne`; for MPS unless explicitly `false`, as device plugin v0.20 does). Names '
    'are read as the plugin reads them: `name: gpu` is `nvidia.com/gpu`, `renameByDefault` gives '
    '`<name>.shared`, `rename` and `devices` are ignored by v0.20'
)
SCOPE = (Signal.GPU_POD,)  # policy/signals.py
# What stays webhook-only, and why (rules/__init__.py).
WEBHOOK_ONLY = ("it judges a request against every device plugin config the pod could land on, a split verdict is a "
                "warning, and a policy denies or warns per binding, not per finding")
MUTATING = False  # denies and warns on /validate only (rules/__init__.py)


def check(pod: PodView, ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    if not ctx.sharing.refuses_more_than_one:  # the configs the pod could land on are some of these
        return findings
    candidates = candidate_configs(pod, ctx)
    for amount in gpu_amounts(pod, ctx):
        count = amount.count
        if count is None or count <= 1:
            continue
        exposing = [(cfg, cfg.lookup(amount.resource)) for cfg in candidates]
        exposing = [(cfg, res) for cfg, res in exposing if res is not None]
        refusing = [cfg.name for cfg, res in exposing if res is not None and res.fail_requests_greater_than_one]
        if not refusing:
            continue
        severity = Severity.DENY if len(refusing) == len(exposing) else Severity.WARN
        findings.append(Finding(
            ID,
            severity,
            f"{amount.container.label} requests {format_count(count)} {amount.resource}; shared GPUs allow 1 "
            f"(config {', '.join(refusing)}): request 1",
            f"{amount.container.path}.resources",
        ))
    return findings
