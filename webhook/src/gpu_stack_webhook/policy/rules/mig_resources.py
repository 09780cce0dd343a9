"""GPU005 mig-resource-exposed: MIG resource names must be ones the configured strategy exposes.

Under migStrategy `none` or `single` no `nvidia.com/mig-*` resource ever exists (`single` exposes MIG
slices as `nvidia.com/gpu`), so a pod asking for one stays Pending forever. Only `mixed` exposes them.
Denied (or warned, by config) when no config the pod could land on exposes the name.
"""

from __future__ import annotations

from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.findings import Finding, Severity
from gpu_stack_webhook.policy.gpus import candidate_configs, gpu_amounts
from gpu_stack_webhook.policy.pod import PodView
from gpu_stack_webhook.policy.sharing import MIG_PREFIX
from gpu_stack_webhook.policy.signals import Signal

ID = "GPU005"
NAME = "mig-resource-exposed"
# The rule's row of docs/policy-rules.md (markdown; `make generate` writes the table).
DOC = (
    'no `nvidia.com/mig-*` request that no candidate node config exposes (only `migStrategy: mixed` does); '
    'deny or warn'
)
SCOPE = (Signal.GPU_POD,)  # policy/signals.py
# What stays webhook-only, and why (rules/__init__.py).
WEBHOOK_ONLY = ("it judges a resource against every device plugin config the pod could land on, a split verdict is a "
                "warning, and a policy denies or warns per binding, not per finding")
MUTATING = False  # denies and warns on /validate only (rules/__init__.py)


def check(pod: PodView, ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    mig = [amount for amount in gpu_amounts(pod, ctx) if amount.resource.startswith(MIG_PREFIX)]
    if not mig:
        return findings
    candidates = candidate_configs(pod, ctx)
    severity = Severity.DENY if ctx.config.rules.mig_unexposed == "deny" else Severity.WARN
    for amount in mig:
        if any(cfg.lookup(amount.resource) for cfg in candidates):
            continue
        strategies = sorted({cfg.mig_strategy for cfg in candidates})
        hint = "use nvidia.com/gpu" if "single" in strategies else "needs migStrategy mixed"
        findings.append(Finding(
            ID,
            severity,
            f"{amount.container.label}: no node exposes {amount.resource} "
            f"(migStrategy {'/'.join(strategies)}); {hint}",
            f"{amount.container.path}.resources",
        ))
    return findings
