"""The JSON log lines on stderr are the lines python-json-logger's OrjsonFormatter writes with the settings
of gunicorn_conf.logging_config: the decision lines, which skip its search for the extra fields
(server/json_logging.py), byte for byte apart from the time; every other line byte for byte."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import re
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import pythonjsonlogger.core
from flask.testing import FlaskClient
from gpu_stack_webhook.policy.config import parse_config
from gpu_stack_webhook.policy.rules import RULES, Rule
from gpu_stack_webhook.server import gunicorn_conf
from gpu_stack_webhook.server.app import AppConfig, create_app
from gpu_stack_webhook.server.decision_log import DECISION_LOGGER
from gpu_stack_webhook.server.json_logging import FIELDS

from .podlib import container, make_pod, review

TIME = re.compile(r'^\{"time":"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})",')
DENIED_AND_WARNED = make_pod(
    [container("app", env_from=[{"configMapRef": {"name": "gpu-env"}}]), container("cuda", gpu=1, privileged=True)],
    name="denied-and-warned",
)
WARNED = make_pod([container("app", env_from=[{"configMapRef": {"name": "gpu-env"}}])], name="warned")


def _crash(*_: Any) -> Iterable[Any]:
    raise ZeroDivisionError("boom")


class FailingLookups:
    @property
    def online(self) -> bool:
        raise RuntimeError("unexpected")


def formatter(stock: bool = False) -> logging.Formatter:
    """The formatter logging_config configures; `stock`: the same settings on OrjsonFormatter itself."""
    spec = dict(gunicorn_conf.logging_config("INFO")["formatters"]["json"])
    if stock:
        spec["()"] = "pythonjsonlogger.orjson.OrjsonFormatter"
    made: logging.Formatter = logging.config.DictConfigurator({}).configure_formatter(spec)
    return made


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def served() -> Iterator[tuple[io.StringIO, Records]]:
    """The decision logger at INFO writing through the configured formatter, and its records."""
    stream, records = io.StringIO(), Records()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter())
    logger = logging.getLogger(DECISION_LOGGER)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    logger.addHandler(records)
    try:
        yield stream, records
    finally:
        logger.removeHandler(handler)
        logger.removeHandler(records)
        logger.setLevel(level)


def without_time(line: str) -> str:
    assert TIME.match(line), line
    return TIME.sub('{"time":"",', line)


def test_denied_warned_and_errored_decision_lines_are_the_lines_the_logging_extra_path_wrote(
        served: tuple[io.StringIO, Records], monkeypatch: pytest.MonkeyPatch) -> None:
    stream, records = served

    def searched(*_: Any) -> None:
        raise AssertionError("a decision line searched the record for its fields")

    def post(client: FlaskClient, path: str, body: Any) -> None:
        client.post(path, data=json.dumps(body), content_type="application/json")

    def client(**kw: Any) -> FlaskClient:
        return create_app(AppConfig(policy=parse_config({"maxRequestBytes": 8192}), **kw)).test_client()

    crashing = Rule(id="GPU999", name="crashes", summary="always raises", check=_crash)
    with monkeypatch.context() as patched:
        patched.setattr(pythonjsonlogger.core, "merge_record_extra", searched)
        post(client(), "/validate", review(DENIED_AND_WARNED, uid="u-deny"))
        post(client(), "/validate", review(WARNED, uid="u-warn"))
        post(client(rules=(*RULES, crashing)), "/validate", review(make_pod(), uid="u-crash"))
        post(client(facts=FailingLookups()), "/mutate", review(make_pod(), uid="u-fail"))
    lines = stream.getvalue().splitlines()
    assert [json.loads(line)["decision"] for line in lines] == ["denied", "allowed", "error", "error"]
    stock, logger = formatter(stock=True), logging.getLogger(DECISION_LOGGER)
    for line, record in zip(lines, records.records, strict=True):
        # What `logger.log(level, "admission decision", extra=fields)` made, as OrjsonFormatter wrote it.
        fields = record.__dict__[FIELDS]
        old = logger.makeRecord(logger.name, record.levelno, "(unknown file)", 0, record.msg, (), None,
                                extra=fields)
        assert without_time(line) == without_time(stock.format(old))
        # The record's attributes are the fields too (caplog, filters), the attribute holding them not in a line.
        assert stock.format(record) == line
    denied = json.loads(lines[0])
    assert list(denied) == ["time", "level", "logger", "message", "uid", "endpoint", "kind", "namespace", "object",
                            "operation", "dryRun", "decision", "allowed", "rules", "duration_ms", "denied_by",
                            "warned", "code", "reason"]
    assert (denied["level"], denied["logger"], denied["message"]) == ("INFO", DECISION_LOGGER, "admission decision")
    assert (json.loads(lines[2])["crashed"], json.loads(lines[3])["error"]) == ("GPU999", "RuntimeError: unexpected")


def test_every_other_line_is_the_line_orjsonformatter_writes() -> None:
    gunicorn = logging.getLogger("gunicorn.error")
    ours = logging.getLogger("gpu_stack_webhook.server.review_routes")

    def record(logger: logging.Logger, level: int, msg: str, *args: Any, **kw: Any) -> logging.LogRecord:
        return logger.makeRecord(logger.name, level, __file__, 1, msg, args, kw.pop("exc_info", None), **kw)

    booting = record(gunicorn, logging.INFO, "Booting worker with pid: %s", 42)
    # Lines within one second (the second formatted once) and one in the next.
    second = int(booting.created)
    booting.created, booting.msecs = second + 0.25, 250.0
    listening = record(gunicorn, logging.INFO, "Listening at: %s (%s)", "https://0.0.0.0:8443", 7)
    listening.created, listening.msecs = second + 0.5, 500.0
    later = record(gunicorn, logging.INFO, "Worker exiting (pid: %s)", 42)
    later.created, later.msecs = second + 1.007, 7.0
    try:
        raise ValueError("broken")
    except ValueError:
        failed = record(gunicorn, logging.ERROR, "Exception in worker %s", "w", exc_info=sys.exc_info())
    rejected = record(ours, logging.WARNING, "rejected admission request",
                      extra={"endpoint": "validate", "status": 400, "error": "not JSON"})
    # Fields in the one attribute with a key OrjsonFormatter leaves out: its path, not the shortcut.
    odd = record(ours, logging.INFO, "odd", extra={"uid": "u"})
    odd.__dict__[FIELDS] = {"uid": "u", "name": "not printed"}
    configured, stock = formatter(), formatter(stock=True)
    lines = [configured.format(r) for r in (booting, listening, later, failed, rejected, odd)]
    assert lines == [stock.format(r) for r in (booting, listening, later, failed, rejected, odd)]
    times = [match[1] for match in map(TIME.match, lines[:3]) if match]
    assert [t[-4:] for t in times] == [",250", ",500", ",007"]
    assert times[0][:-4] == times[1][:-4] != times[2][:-4]
