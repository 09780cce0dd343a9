"""One JSON log line per review, from the structured reply (never the object itself).

Denials, warnings and errors are logged at INFO; allowed and skipped reviews, and patches whose only
warnings say what was changed, at DEBUG (`serve --log-level debug` shows them), so the default level
costs nothing on the common paths: the line is not even built when its level is off. A patch is not
news an operator would miss: the API server's audit log records it under our `mutations` audit
annotation (Metadata level) and the patch itself (Request level), the user saw the change's warning,
and `gpu_stack_rule_findings_total` counts it per rule. Requests that are not a review we can answer
(HTTP 4xx) are one WARNING line each; an unexpected exception is logged where it happened, with its
traceback (admission/pipeline.py).

A decision record carries its fields twice: as its attributes, as `extra=` would set them (for caplog and
filters), and in one attribute from which the JSON formatter writes the line without searching the record
for them (server/json_logging.py). The line is the one python-json-logger's OrjsonFormatter wrote; writing
it costs 11.7 µs instead of 18.0 µs (the INFO replies of the bench's /validate pod mix, in process, through
gunicorn_conf.logging_config with lean_log_records, stderr on a file; tests/webhook/test_json_log_lines.py).
"""

from __future__ import annotations

import logging
from typing import Any

from gpu_stack_webhook.admission.decide import Decision, Endpoint
from gpu_stack_webhook.admission.pipeline import Reply
from gpu_stack_webhook.server.json_logging import FIELDS

DECISION_LOGGER = "gpu_stack_webhook.decisions"
decision_log = logging.getLogger(DECISION_LOGGER)
log = logging.getLogger("gpu_stack_webhook.server.review_routes")
MESSAGE = "admission decision"


def level_of(decision: Decision) -> int:
    """INFO for what someone may need to know (denied, warned, failed), else DEBUG."""
    if decision.allowed and not decision.crashed and not decision.warned:
        return logging.DEBUG
    return logging.INFO


def log_reply(endpoint: Endpoint, reply: Reply, seconds: float) -> None:
    request, decision = reply.request, reply.decision
    if request is None or decision is None:
        if reply.status < 500:  # a 500 before the uid was known is logged with its traceback already
            log.warning("rejected admission request",
                        extra={"endpoint": endpoint.value, "status": reply.status, "error": reply.error})
        return
    level = level_of(decision)
    if not decision_log.isEnabledFor(level):
        return
    fields: dict[str, Any] = {
        "uid": request.uid,
        "endpoint": endpoint.value,
        "kind": f"{request.group}/{request.kind}" if request.group else request.kind,
        "namespace": request.namespace,
        "object": request.display_name,
        "operation": request.operation,
        "dryRun": request.dry_run,
        "decision": decision.outcome,
        "allowed": decision.allowed,
        "rules": list(decision.rules),
        "duration_ms": round(seconds * 1000, 3),
    }
    if request.sub_resource:
        fields["subResource"] = request.sub_resource
    for key, rules in (("denied_by", decision.denied_by), ("warned", decision.warned),
                       ("mutated", decision.mutated)):
        if rules:
            fields[key] = list(rules)
    if decision.crashed:
        fields["crashed"] = decision.crashed
    if decision.skipped:
        fields["skipped"] = decision.skipped
    if not decision.allowed:
        fields["code"] = decision.code
        fields["reason"] = decision.message
    if decision.patch:
        fields["patch_ops"] = len(decision.patch)
    if reply.error:
        fields["error"] = reply.error
    # Logger.log(level, MESSAGE, extra=fields) makes this record, with the fields as its attributes; they
    # are also in one attribute, from which the JSON formatter writes them (json_logging.py).
    record = decision_log.makeRecord(DECISION_LOGGER, level, "(unknown file)", 0, MESSAGE, (), None)
    attributes = record.__dict__
    attributes.update(fields)
    attributes[FIELDS] = fields
    decision_log.handle(record)
