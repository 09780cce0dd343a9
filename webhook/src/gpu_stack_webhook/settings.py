"""The one place the package reads the environment: typed settings (pydantic-settings), read once per
process by `load_settings()` and handed to whatever needs them.

`WebhookSettings` is what the webhook reads (the chart sets GPU_STACK_WEBHOOK_CONFIG, _WORKERS and _THREADS);
`TerminalSettings` is the two conventions `inspect` honours when it decides on colour. Unset or blank
means the default; a bad value stops the command with a message naming the variable, e.g.
`$GPU_STACK_WEBHOOK_WORKERS must be an integer >= 1, got '0'`. README "Environment variables" lists
them (tests/webhook/test_settings.py keeps that table and this module in step).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_WORKERS = 2
DEFAULT_THREADS = 4
DEFAULT_RELOAD_SECONDS = 10.0
DEFAULT_REQUEST_TIMEOUT = 15.0

_FROM_ENVIRONMENT = SettingsConfigDict(
    case_sensitive=True,  # the names are exactly as documented (and TERM is not term)
    env_ignore_empty=True,  # VAR= means the default, as unset does
    extra="ignore",
    frozen=True,
)


class WebhookSettings(BaseSettings):
    """What `gpu-stack-webhook` reads from its environment. Field descriptions feed the README table."""

    model_config = _FROM_ENVIRONMENT

    policy_path: str | None = Field(
        None, validation_alias="GPU_STACK_WEBHOOK_CONFIG",
        description="policy file when `--config` is not given; unset: the built-in defaults")
    workers: int = Field(
        DEFAULT_WORKERS, ge=1, validation_alias="GPU_STACK_WEBHOOK_WORKERS",
        description="`serve`: gunicorn worker processes when `--workers` is not given")
    threads: int = Field(
        DEFAULT_THREADS, ge=1, validation_alias="GPU_STACK_WEBHOOK_THREADS",
        description="`serve`: threads per worker when `--threads` is not given")
    reload_seconds: float = Field(
        DEFAULT_RELOAD_SECONDS, ge=0.0, allow_inf_nan=False, validation_alias="GPU_STACK_WEBHOOK_RELOAD_SECONDS",
        description="`serve`: how often each worker checks the policy file for a change; 0 turns reloading off")
    request_timeout: float = Field(
        DEFAULT_REQUEST_TIMEOUT, gt=0.0, allow_inf_nan=False, validation_alias="GPU_STACK_WEBHOOK_REQUEST_TIMEOUT",
        description="`serve`: seconds a request may take to arrive once it started before its connection is cut")
    prometheus_multiproc_dir: str | None = Field(
        None, validation_alias="PROMETHEUS_MULTIPROC_DIR",
        description="`/metrics` aggregated over the processes writing there (prometheus_client's own variable); "
                    "`serve` sets a fresh one for its workers")
    pod_namespace: str | None = Field(
        None, validation_alias="POD_NAMESPACE",
        description="`serve --tls-mode self-managed`: the namespace when `--namespace` is not given "
                    "(else the ServiceAccount's)")

    @field_validator("workers", "threads", "reload_seconds", "request_timeout", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any, info: ValidationInfo) -> Any:
        """`VAR="  "` means the default, as `VAR=` does (env_ignore_empty only catches the empty string)."""
        if isinstance(value, str):
            value = value.strip()
            if not value:
                assert info.field_name is not None
                return cls.model_fields[info.field_name].default
        return value


class TerminalSettings(BaseSettings):
    """What `inspect` reads to decide on colour, apart from WebhookSettings so a bad webhook variable never
    stops it."""

    model_config = _FROM_ENVIRONMENT

    no_color: str = Field("", validation_alias="NO_COLOR",
                          description="`inspect`: any non-empty value turns colour off (https://no-color.org)")
    term: str = Field("", validation_alias="TERM", description="`inspect`: `dumb` turns colour off")


SettingsModel = TypeVar("SettingsModel", bound=BaseSettings)

_NOUNS: dict[object, str] = {int: "an integer", float: "a number"}
_BOUNDS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
_BOUND_KEYS = {"greater_than_equal": "ge", "greater_than": "gt", "less_than_equal": "le", "less_than": "lt"}


def _message(model: type[BaseSettings], error: Any) -> str:
    name = str(error["loc"][0])
    field = next((f for f in model.model_fields.values() if f.validation_alias == name), None)
    noun = _NOUNS.get(field.annotation, "a valid value") if field is not None else "a valid value"
    kind = error["type"]
    if kind in _BOUNDS:
        noun = f"{noun} {_BOUNDS[kind]} {error['ctx'][_BOUND_KEYS[kind]]}"
    elif kind == "finite_number":
        noun = "a finite number"
    return f"${name} must be {noun}, got {error['input']!r}"


def _load(model: type[SettingsModel]) -> SettingsModel:
    try:
        return model()
    except ValidationError as exc:
        raise ValueError("; ".join(_message(model, e) for e in exc.errors())) from None


def load_settings() -> WebhookSettings:
    """The webhook's settings from the environment; ValueError naming every variable with a bad value."""
    return _load(WebhookSettings)


def load_terminal_settings() -> TerminalSettings:
    return _load(TerminalSettings)


def variables(model: type[BaseSettings]) -> list[tuple[str, str, str]]:
    """(variable, default, description) per setting, in declaration order: the README table."""
    rows = []
    for field in model.model_fields.values():
        default = "unset" if field.default in (None, "") else f"`{field.default}`"
        rows.append((str(field.validation_alias), default, field.description or ""))
    return rows
