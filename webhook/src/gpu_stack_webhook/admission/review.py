"""admission.k8s.io/v1 on the wire: parse an AdmissionReview request, encode the one response shape we send.

A review we cannot read raises `BadReview` (the HTTP layer answers 400); everything about the object itself
is decided in decide.py and answered inside a proper AdmissionReview response built here from the
decision's fields. Pure functions, except the memo of the last encoded patch (`_LastPatch`, see there).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

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
                 "sub_resource", "uid", "username", "version")

    def __init__(self, *, uid: str, group: str, version: str, kind: str, operation: str, namespace: str,
                 name: str, sub_resource: str, object: Mapping[str, Any] | None,
                 old_object: Mapping[str, Any] | None, dry_run: bool, username: str = "") -> None:
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
        self.username = username  # userInfo.username: who sent the request, as the API server authenticated it

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
                            object=obj, old_object=old, dry_run=bool(request.get("dryRun")),
                            username=_text((request.get("userInfo") or {}).get("username")
                                           if isinstance(request.get("userInfo"), dict) else ""))


def _text(value: Any) -> str:
    """A string field of the request: absent or null is "", anything else its text."""
    return value if type(value) is str else str(value or "")


def short_warning(text: str) -> str:
    """kubectl prints each warning on its own line; Kubernetes asks to keep them under 120 characters."""
    return text if len(text) <= MAX_WARNING_CHARS else text[: MAX_WARNING_CHARS - 1] + "…"


class _LastPatch:
    """The last patch encoded, by identity: the pods of one workload get the very same operations from the
    engine's diff memo (policy/desired.py), so consecutive reviews mostly send the same encoded patch.

    Module-level state in this otherwise pure module, shared by every thread of a gunicorn gthread worker.
    Bounded by construction (one entry). Thread-safe without a lock: the (patch, encoding) pair is one
    tuple, read and replaced in one attribute access, and compared by identity, so a thread gets its own
    patch's encoding or encodes it itself; never another's. Tested from several threads at once
    (tests/webhook/test_memo_threads.py)."""

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


def build_response(uid: str, allowed: bool, *, code: int = 403, message: str = "", warnings: tuple[str, ...] = (),
                   patch: tuple[JsonPatchOp, ...] = (), audit: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The AdmissionReview response: uid, apiVersion and kind echoed; status (`code`, `message`) on denial;
    `patch` only when allowed (the caller passes one on the mutating endpoint only); `audit` as the
    auditAnnotations."""
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        code = code if code in REASONS else 403
        response["status"] = {"code": code, "reason": REASONS[code], "message": message}
    if warnings:
        response["warnings"] = [short_warning(w) for w in warnings]
    if allowed and patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = _encoded_patches.encoded(patch)
    if audit:
        response["auditAnnotations"] = dict(audit)
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
