"""admission.k8s.io/v1 on the wire: parse an AdmissionReview, build the one response shape we send.

Pure functions. A review we cannot read raises `BadReview` (the HTTP layer answers 400); everything
about the object itself is a `Decision` answered inside a proper AdmissionReview response.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import orjson

from gpu_stack_webhook.policy.findings import JsonPatchOp

API_VERSION = "admission.k8s.io/v1"
OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
MAX_WARNING_CHARS = 120
REASONS = {400: "BadRequest", 403: "Forbidden", 500: "InternalError"}


class BadReview(ValueError):
    """The body is not an admission.k8s.io/v1 AdmissionReview request we can answer."""


class AdmissionRequest:
    """The fields of an AdmissionReview request we read, built once per review by parse_review and not
    modified after. A plain slotted class: compiled (webhook/setup.py), building it and reading its fields
    are native, where a NamedTuple's __new__ is generated Python and its fields are read through descriptors."""

    __slots__ = ("dry_run", "group", "kind", "name", "namespace", "object", "old_object", "operation",
                 "sub_resource", "uid", "version")

    def __init__(self, *, uid: str, group: str, version: str, kind: str, operation: str, namespace: str,
                 name: str, sub_resource: str, object: Mapping[str, Any] | None,
                 old_object: Mapping[str, Any] | None, dry_run: bool) -> None:
        self.uid = uid
        self.group = group
        self.version = version
        self.kind = kind
        self.operation = operation
        self.namespace = namespace
        self.name = name
        self.sub_resource = sub_resource
        self.object = object
        self.old_object = old_object
        self.dry_run = dry_run

    def __repr__(self) -> str:
        return f"AdmissionRequest({self.uid} {self.operation} {self.group or 'core'}/{self.kind} {self.display_name})"

    @property
    def display_name(self) -> str:
        """namespace/name for logs and messages; generateName+ when the server has not named it yet."""
        name = self.name
        if not name and isinstance(self.object, Mapping):
            meta = self.object.get("metadata") or {}
            name = meta.get("name") or (f"{meta.get('generateName', '')}*" if meta.get("generateName") else "")
        return f"{self.namespace}/{name}" if self.namespace else str(name)


Outcome = Literal["allowed", "denied", "patched", "skipped", "error"]
# `Decision.crashed` when the failure was outside the rules (no rule to name).
WEBHOOK_FAILURE = "webhook"


class Decision:
    """The verdict on one request, structured: the response, the audit annotations, the metrics and the
    decision log are all derived from these fields (never from each other's text). Not modified once
    built (a plain slotted class, like AdmissionRequest)."""

    __slots__ = ("allowed", "code", "crashed", "denied_by", "message", "mutated", "patch", "skipped", "warned",
                 "warnings")

    def __init__(self, allowed: bool, *, code: int = 200, message: str = "", warnings: tuple[str, ...] = (),
                 patch: tuple[JsonPatchOp, ...] = (), denied_by: tuple[str, ...] = (), warned: tuple[str, ...] = (),
                 mutated: tuple[str, ...] = (), crashed: str = "", skipped: str = "") -> None:
        self.allowed = allowed
        self.code = code
        self.message = message
        self.warnings = warnings
        self.patch = patch
        # Rule IDs by role: the denials, the warnings (/validate), the changes and their notes (/mutate).
        self.denied_by = denied_by
        self.warned = warned
        self.mutated = mutated
        # The rule that raised (or WEBHOOK_FAILURE): the answer is the fail-closed one.
        self.crashed = crashed
        # Why the object was not judged at all (exempt namespace, operation, kind), for logs.
        self.skipped = skipped

    def __repr__(self) -> str:
        return f"Decision({self.outcome}, code={self.code}, rules={self.rules})"

    @property
    def outcome(self) -> Outcome:
        if self.crashed:
            return "error"
        if self.skipped:
            return "skipped"
        if not self.allowed:
            return "denied"
        return "patched" if self.patch else "allowed"

    @property
    def rules(self) -> tuple[str, ...]:
        """Every rule that reported, once, in the order crashed, denied, warned, mutated."""
        crashed = (self.crashed,) if self.crashed and self.crashed != WEBHOOK_FAILURE else ()
        return tuple(dict.fromkeys((*crashed, *self.denied_by, *self.warned, *self.mutated)))

    def severities(self) -> Iterator[tuple[str, str]]:
        """(rule, severity) for every rule that reported: error (it crashed), deny or warn."""
        for rule in self.rules:
            yield rule, ("error" if rule == self.crashed else "deny" if rule in self.denied_by else "warn")

    @property
    def audit(self) -> dict[str, str]:
        """The auditAnnotations (keys without a prefix: the API server adds the webhook's name)."""
        if self.crashed:
            return {"internal-error": self.crashed}
        if self.denied_by:
            return {"denied-by": ",".join(self.denied_by)}
        if self.mutated:
            return {"mutations": ",".join(self.mutated)}
        if self.warned:
            return {"warnings": ",".join(self.warned)}
        return {}


def parse_review(body: Any) -> AdmissionRequest:
    """Validate the envelope of an AdmissionReview request (already decoded from JSON or YAML, so its
    objects are dicts)."""
    if not isinstance(body, dict):
        raise BadReview("body must be a JSON object (an AdmissionReview)")
    if body.get("apiVersion") != API_VERSION or body.get("kind") != "AdmissionReview":
        raise BadReview(f"expected apiVersion {API_VERSION} kind AdmissionReview, "
                        f"got {body.get('apiVersion')!r} {body.get('kind')!r}")
    request = body.get("request")
    if not isinstance(request, dict):
        raise BadReview("AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid is missing")
    kind = request.get("kind")
    if not isinstance(kind, dict) or not isinstance(kind.get("kind"), str):
        raise BadReview("request.kind is missing")
    operation = request.get("operation")
    if not isinstance(operation, str) or operation not in OPERATIONS:  # a list or object is unhashable
        raise BadReview(f"request.operation {operation!r} is not one of {sorted(OPERATIONS)}")
    obj, old = request.get("object"), request.get("oldObject")
    if obj is not None and not isinstance(obj, dict):
        raise BadReview("request.object must be an object or null")
    if old is not None and not isinstance(old, dict):
        raise BadReview("request.oldObject must be an object or null")
    return AdmissionRequest(uid=uid, group=_text(kind.get("group")), version=_text(kind.get("version")),
                            kind=kind["kind"], operation=operation, namespace=_text(request.get("namespace")),
                            name=_text(request.get("name")), sub_resource=_text(request.get("subResource")),
                            object=obj, old_object=old, dry_run=bool(request.get("dryRun")))


def _text(value: Any) -> str:
    """A string field of the request: absent or null is "", anything else its text."""
    return value if type(value) is str else str(value or "")


def short_warning(text: str) -> str:
    """kubectl prints each warning on its own line; Kubernetes asks to keep them under 120 characters."""
    return text if len(text) <= MAX_WARNING_CHARS else text[: MAX_WARNING_CHARS - 1] + "…"


class _LastPatch:
    """The last patch encoded, by identity: the pods of one workload get the very same operations from the
    engine's diff memo (policy/desired.py), so consecutive reviews mostly send the same encoded patch."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        # (patch, its encoding) in one tuple, read and replaced whole, so a thread never pairs one
        # patch with another's encoding; holding the patch keeps its id from being reused.
        self.last: tuple[tuple[JsonPatchOp, ...], str] = ((), "")

    def encoded(self, patch: tuple[JsonPatchOp, ...]) -> str:
        """The JSONPatch as the response carries it: base64 of its JSON."""
        last_patch, last_encoded = self.last
        if last_patch is patch:
            return last_encoded
        encoded = base64.b64encode(orjson.dumps(list(patch))).decode()
        self.last = (patch, encoded)
        return encoded


_encoded_patches = _LastPatch()


def build_response(uid: str, decision: Decision, *, allow_patch: bool) -> dict[str, Any]:
    """The AdmissionReview response: uid, apiVersion and kind echoed; status on denial; patch only
    when `allow_patch` (the mutating endpoint) and the object is allowed."""
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        code = decision.code if decision.code in REASONS else 403
        response["status"] = {"code": code, "reason": REASONS[code], "message": decision.message}
    if decision.warnings:
        response["warnings"] = [short_warning(w) for w in decision.warnings]
    if allow_patch and decision.allowed and decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = _encoded_patches.encoded(decision.patch)
    audit = decision.audit
    if audit:
        response["auditAnnotations"] = audit
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
