"""The environment variables table of docs/operations.md, from the webhook's settings (settings.py: every
variable it reads, its default and its meaning; `make generate`)."""

from __future__ import annotations

from gpu_stack_webhook.settings import TerminalSettings, WebhookSettings, variables

from gpu_stack_dev.generate.paths import with_section

SECTION = "env-table"


def table() -> str:
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    rows += [f"| `{name}` | {default} | {meaning} |"
             for name, default, meaning in variables(WebhookSettings) + variables(TerminalSettings)]
    return "\n".join(rows) + "\n"


def readme(text: str) -> str:
    """docs/operations.md `text` with its environment variables table made from settings.py."""
    return with_section(text, SECTION, table())
