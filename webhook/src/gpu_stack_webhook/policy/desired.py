"""The pod a review wants: what the rules change, and the JSONPatch from the object to it.

Rules never write patch operations. A rule that changes something edits the desired pod (`edit`) and
reports a WARN finding with `changed=True` that says what it changed; the engine turns the difference
into RFC 6902 operations with `jsonpatch.make_patch`. Most reviews change nothing, so nothing is copied
until the first edit, and then only the nodes on the way to what is edited (copy on write): everything
else stays shared with the request, so jsonpatch is handed only what an edit touched (`_unshared`).

The pods of one workload are edited alike (the same hostIPC, toleration and nodeSelector for every
replica), so the same difference comes back review after review: jsonpatch's answer for it is kept
(`_diff_of`, a bounded LRU keyed by the exact JSON of the two sides, and computed from that JSON).

Module-level state: `_diff_of` (1,024 entries) and `_tokens` (4,096) are functools.lru_cache memos shared
by every thread of a gunicorn gthread worker. Each value is a function of its key alone, and lru_cache
keeps its table consistent under threads (a race computes a value twice, never a wrong one); the
operations handed out are shared between reviews and only ever serialised, never edited. Tested from
several threads at once (tests/webhook/test_memo_threads.py).
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Mapping
from typing import Any

import jsonpatch
import orjson
from jsonpointer import unescape as unescape_token
from mypy_extensions import mypyc_attr

from gpu_stack_webhook.policy.findings import JsonPatchOp


@mypyc_attr(native_class=False)  # mypyc compiles no subclass of RuntimeError
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
        for token in _tokens(pointer):
            key: str | int = int(token) if isinstance(node, list) else token
            child = node[key]
            if id(child) not in self._owned:
                if not isinstance(child, dict | list):
                    raise TypeError(f"{pointer}: {type(child).__name__} is not an object or an array")
                child = node[key] = child.copy()
                self._owned.add(id(child))
            node = child
        return node

    def patch(self) -> tuple[JsonPatchOp, ...]:
        """RFC 6902 operations from the object to the desired pod (() when nothing was edited). The
        operations may be shared with other reviews: read them, never modify them."""
        if self._root is None:
            return ()
        src, dst = _unshared(self._source, self._root)
        try:
            key = orjson.dumps((src, dst))
        except TypeError:  # an integer over 64 bits: not a key orjson can write
            return _diff(src, dst)
        # orjson writes NaN and infinities (YAML `.inf` through `check`) as null: a key holding null
        # could stand for another value, so it is not looked up.
        return _diff(src, dst) if b"null" in key else _diff_of(key)


@functools.lru_cache(maxsize=4096)
def _tokens(pointer: str) -> tuple[str, ...]:
    """The unescaped tokens of a JSON pointer ("/spec/containers/0" -> spec, containers, 0). Rules edit
    the same few pointers in every review (/spec, /spec/containers/0/resources/limits)."""
    return tuple(unescape_token(token) for token in pointer.split("/")[1:])


def _diff(src: Any, dst: Any) -> tuple[JsonPatchOp, ...]:
    # jsonpatch's public diff (stefankoegl/python-json-patch jsonpatch.py JsonPatch.from_diff, 1.33), without
    # its search for values to move: rules add, replace and remove. It deep-copies the operations, about
    # 15 us more than the DiffBuilder alone for a typical pod, paid once per difference (`_diff_of`).
    return tuple(jsonpatch.JsonPatch.from_diff(src, dst, optimization=False, dumps=_dumps).patch)


@functools.lru_cache(maxsize=1024)
def _diff_of(key: bytes) -> tuple[JsonPatchOp, ...]:
    """The diff of the two sides written in `key` (JSON without null, so it reads back exactly)."""
    src, dst = orjson.loads(key)
    return _diff(src, dst)


def _dumps(value: Any) -> str:
    # How jsonpatch tells values apart (1 from True, "1" from 1): orjson is several times faster than
    # json.dumps; what it cannot write (integers over 64 bits, non-string keys) json.dumps writes.
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value)


def _unshared(src: Any, dst: Any) -> tuple[Any, Any]:
    """`src` and `dst` (two objects, or two arrays) without what they share, for jsonpatch to compare.

    Members that are the same object in both are left out; members edited inside are reduced in turn.
    An array that kept its length and whose changed items were all edited inside becomes an object
    keyed by index, and an array only appended to becomes the object of its new items: the paths
    jsonpatch writes for these ("/spec/containers/0/...", "/spec/tolerations/2") are those of the
    arrays. Any other array change is left whole to jsonpatch, which matches up the items itself."""
    if type(src) is list:
        if len(dst) > len(src) and all(map(operator.is_, src, dst)):
            return {}, {str(index): dst[index] for index in range(len(src), len(dst))}
        changed = [(index, a, b) for index, (a, b) in enumerate(zip(src, dst, strict=False)) if a is not b]
        if len(src) != len(dst) or not all(_reducible(a, b) for _, a, b in changed):
            return src, dst
        pairs = {str(index): _unshared(a, b) for index, a, b in changed}
        return {k: a for k, (a, _) in pairs.items()}, {k: b for k, (_, b) in pairs.items()}
    src_left: dict[str, Any] = {}
    dst_left: dict[str, Any] = {}
    added = 0
    # Most members are shared (the same object on both sides): find the others in one comprehension.
    for key, a, b in [(key, a, b) for key, b in dst.items() if (a := src.get(key, _ABSENT)) is not b]:
        if _reducible(a, b):
            src_left[key], dst_left[key] = _unshared(a, b)
        else:
            if a is _ABSENT:
                added += 1
            else:
                src_left[key] = a
            dst_left[key] = b
    if len(src) + added > len(dst):  # len(dst) = len(src) - removed + added: some member was removed
        src_left.update((key, a) for key, a in src.items() if key not in dst)
    return src_left, dst_left


def _reducible(src: Any, dst: Any) -> bool:
    return (type(src) is dict and type(dst) is dict) or (type(src) is list and type(dst) is list)


_ABSENT: Any = object()


# The desired pod of every review that cannot be patched: it refuses edits, so one serves them all.
READ_ONLY = DesiredPod({})
