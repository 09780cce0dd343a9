"""The table of docs/cel-mode.md saying, per rule, which CEL policies twin it and what stays in the webhook, from
the rule modules (CEL_VALIDATION, CEL_MUTATION, WEBHOOK_ONLY; `make generate`)."""

from __future__ import annotations

from gpu_stack_webhook.policy.rules import RULES

from gpu_stack_dev.generate.paths import with_section

SECTION = "cel-rules-table"


def table() -> str:
    rows = ["| Rule | ValidatingAdmissionPolicy | MutatingAdmissionPolicy | Stays in the webhook |",
            "|---|---|---|---|"]
    for rule in RULES:
        stays = rule.webhook_only.replace("|", "\\|") or "—"
        rows.append(f"| {rule.id} `{rule.name}` | {'yes' if rule.cel_validation else '—'} | "
                    f"{'yes' if rule.cel_mutation else '—'} | {stays} |")
    return "\n".join(rows) + "\n"


def readme(text: str) -> str:
    """docs/cel-mode.md `text` with its rule table made from the rule modules."""
    return with_section(text, SECTION, table())
