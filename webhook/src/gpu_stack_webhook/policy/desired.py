"""The pod a review wants: what the rules change, and the JSONPatch from the object to it.

Rules never write patch operations. A rule that changes something edits the desired pod (`edit`) and
reports a WARN finding with `changed=True` that says what it changed; the engine turns the difference
into RFC 6902 operations with `jsonpatch.make_patch`. Most reviews change nothing, so nothing is copied
until the first edit, and then only the nodes on the way to what is edited (copy on write): everything
else stays shared with the request, so the diff skips it by identity and jsonpatch only compares what
an edit touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonpatch
from jsonpointer import escape as escape_token
from jsonpointer import unescape as unescape_token

from gpu_stack_webhook.policy.findings import JsonPatchOp


class ReadOnlyPodError(RuntimeError):
    """A rule edited the desired pod of a review that cannot be patched (check ctx.can_patch first)."""


class DesiredPod:
    """The object under review as the rules want it; the request's object is never modified."""

    __slots__ = ("_owned", "_root", "_source", "_writable")

    def __init__(self, source: Mapping[str, Any], *, writable: bool = False) -> None:
        self._source = source
        self._writable = writable
        self._root: dict[str, Any] | None = None
        self._owned: set[int] = set()  # ids of the copies made here: edited in place, never copied twice

    @property
    def changed(self) -> bool:
        return self._root is not None

    def edit(self, pointer: str) -> Any:
        """The dict or list at `pointer` (a JSON pointer into the object, e.g. `container.pointer +
        "/resources"`) in the desired pod: this review's own copy, whose members a rule may set, add or
        delete. The values it holds are still the request's: to change something inside one of them,
        edit that one (or replace it with a new value). Raises KeyError/IndexError when a step is absent."""
        if not self._writable:
            raise ReadOnlyPodError(f"edit({pointer!r}) of a review that cannot be patched")
        node: Any = self._root
        if node is None:
            node = self._root = dict(self._source)
            self._owned.add(id(node))
        for token in pointer.split("/")[1:]:
            key: str | int = int(token) if isinstance(node, list) else unescape_token(token)
            child = node[key]
            if id(child) not in self._owned:
                if not isinstance(child, dict | list):
                    raise TypeError(f"{pointer}: {type(child).__name__} is not an object or an array")
                child = node[key] = child.copy()
                self._owned.add(id(child))
            node = child
        return node

    def patch(self) -> list[JsonPatchOp]:
        """RFC 6902 operations from the object to the desired pod ([] when nothing was edited)."""
        if self._root is None:
            return []
        ops: list[JsonPatchOp] = []
        _diff(self._source, self._root, "", ops)
        return ops


def _descends(src: Any, dst: Any) -> bool:
    # jsonpatch compares two objects, or two arrays of one length, member by member (by position)
    # too, so diffing their members one by one gives the same operations.
    if type(src) is dict and type(dst) is dict:
        return True
    return type(src) is list and type(dst) is list and len(src) == len(dst)


def _diff(src: Any, dst: Any, pointer: str, ops: list[JsonPatchOp]) -> None:
    """Append to `ops` the operations from `src` to `dst` (two objects or two arrays of one length)
    at `pointer`. Shared members are equal by construction; the rest goes to jsonpatch."""
    if type(src) is list:
        changed = [(index, a, b) for index, (a, b) in enumerate(zip(src, dst, strict=True)) if a is not b]
        if all(_descends(a, b) for _, a, b in changed):
            for index, a, b in changed:
                _diff(a, b, f"{pointer}/{index}", ops)
        else:
            _make_patch(src, dst, pointer, ops)
        return
    rest_src: dict[str, Any] = {}
    rest_dst: dict[str, Any] = {}
    for key, b in dst.items():
        a = src.get(key, _ABSENT)
        if a is b:
            continue
        if _descends(a, b):
            _diff(a, b, f"{pointer}/{escape_token(key)}", ops)
        else:
            if a is not _ABSENT:
                rest_src[key] = a
            rest_dst[key] = b
    rest_src.update((key, a) for key, a in src.items() if key not in dst)
    if rest_src or rest_dst:
        _make_patch(rest_src, rest_dst, pointer, ops)


def _make_patch(src: Any, dst: Any, pointer: str, ops: list[JsonPatchOp]) -> None:
    for op in jsonpatch.make_patch(src, dst).patch:
        op["path"] = pointer + op["path"]
        if "from" in op:
            op["from"] = pointer + op["from"]
        ops.append(op)


_ABSENT: Any = object()
