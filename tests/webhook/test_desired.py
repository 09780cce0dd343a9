"""The rule interface: rules edit the desired pod, the engine makes the JSONPatch (policy/desired.py).

- any edits, anywhere, give a patch that turns the request's object into the edited one, and the
  request's object itself is never modified;
- nothing edited, no patch; a review that cannot be patched refuses edits (the rule crashes, never a
  silent change);
- a new rule is one module: a check that edits the desired pod and reports the change is all /mutate needs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from gpu_stack_webhook.admission import decide
from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.admission.review import parse_review
from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.desired import DesiredPod, ReadOnlyPodError
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.policy.findings import Finding, Severity
from gpu_stack_webhook.policy.pod import PodView
from gpu_stack_webhook.policy.rules import RULES, Rule
from hypothesis import given
from hypothesis import strategies as st
from jsonpointer import escape

from .podlib import apply_patch, container, make_pod, review

KEYS = st.sampled_from(["a", "b", "c/d", "e~f", "0", ""])
SCALARS = st.none() | st.booleans() | st.integers(-2, 2) | st.sampled_from(["", "x", "1"])
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
                      max_leaves=12)
DOCUMENTS = st.dictionaries(KEYS, VALUES, max_size=4)


def containers(node: Any, pointer: str = "") -> Iterator[tuple[str, Any]]:
    """(pointer, node) of every object and array in a document, itself first."""
    if isinstance(node, dict):
        yield pointer, node
        for key, value in node.items():
            yield from containers(value, f"{pointer}/{escape(key)}")
    elif isinstance(node, list):
        yield pointer, node
        for index, value in enumerate(node):
            yield from containers(value, f"{pointer}/{index}")


def edit(node: Any, draw: Callable[[st.SearchStrategy[Any]], Any]) -> None:
    """One random change of an object's or an array's members."""
    if isinstance(node, dict):
        key = draw(KEYS)
        if key in node and draw(st.booleans()):
            del node[key]
        else:
            node[key] = draw(VALUES)
    elif node and draw(st.booleans()):
        index = draw(st.integers(0, len(node) - 1))
        action = draw(st.sampled_from(["set", "pop", "insert"]))
        if action == "set":
            node[index] = draw(VALUES)
        elif action == "pop":
            node.pop(index)
        else:
            node.insert(index, draw(VALUES))
    else:
        node.append(draw(VALUES))


@given(document=DOCUMENTS, data=st.data())
def test_the_patch_turns_the_object_into_the_edited_one(document: dict[str, Any], data: st.DataObject) -> None:
    original = copy.deepcopy(document)
    desired = DesiredPod(document, writable=True)
    expected = copy.deepcopy(document)  # the same edits, made on a plain copy
    for _ in range(data.draw(st.integers(1, 4))):
        nodes = dict(containers(expected))
        pointer = data.draw(st.sampled_from(sorted(nodes)))
        drawn: list[Any] = []

        def record(strategy: st.SearchStrategy[Any], drawn: list[Any] = drawn) -> Any:
            value = data.draw(strategy)
            drawn.append(copy.deepcopy(value))
            return value

        edit(nodes[pointer], record)
        replay = iter(drawn)
        edit(desired.edit(pointer), lambda _strategy, replay=replay: next(replay))
    assert document == original, "the request's object was modified"
    assert apply_patch(document, desired.patch()) == expected


def test_nothing_edited_no_patch() -> None:
    pod = make_pod([container("cuda", gpu=1)])
    desired = DesiredPod(pod, writable=True)
    assert not desired.changed and desired.patch() == ()
    desired.edit("/spec")  # a copy, unchanged
    assert desired.changed and desired.patch() == ()


def test_pods_edited_alike_get_the_same_patch_each_for_its_own_object() -> None:
    patches = []
    for name in ("replica-a", "replica-b"):
        pod = make_pod([container("cuda", gpu=1)], name=name)
        desired = DesiredPod(pod, writable=True)
        desired.edit("/spec")["hostIPC"] = True
        desired.edit("/spec/containers/0/resources/limits")["nvidia.com/gpu"] = "2"
        patched = apply_patch(pod, desired.patch())
        assert patched["metadata"]["name"] == name
        assert patched["spec"]["hostIPC"] is True
        assert patched["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
        patches.append(desired.patch())
    assert patches[0] == patches[1]


def test_a_value_json_writes_as_null_is_never_taken_for_null() -> None:
    """orjson writes infinity (YAML `.inf`, through `check`) as null: the remembered diffs must not
    answer for it."""
    patches = []
    for value in (None, float("inf")):
        desired = DesiredPod({"spec": {"x": 1}}, writable=True)
        desired.edit("/spec")["x"] = value
        patches.append(desired.patch())
    assert patches == [({"op": "replace", "path": "/spec/x", "value": None},),
                       ({"op": "replace", "path": "/spec/x", "value": float("inf")},)]


def test_a_review_that_cannot_be_patched_refuses_edits() -> None:
    pod = make_pod([container("cuda", gpu=1)])
    with pytest.raises(ReadOnlyPodError):
        PodView.of(pod, "Pod").desired.edit("/spec")


ANNOTATION = "example.com/gpu-checked"


def annotate(pod: PodView, ctx: Context) -> Iterator[Finding]:
    """A rule in one function: mark GPU pods being created with an annotation, and say so."""
    if ctx.can_patch and pod.kind == "Pod" and ANNOTATION not in pod.annotations:
        pod.desired.edit(f"/{pod.metadata_path}").setdefault("annotations", {})
        pod.desired.edit(f"/{pod.metadata_path}/annotations")[ANNOTATION] = "true"
        yield Finding("GPU999", Severity.WARN, f"added annotation {ANNOTATION}", f"{pod.metadata_path}.annotations",
                      changed=True)


@pytest.mark.parametrize("annotations", [None, {"team": "ml"}], ids=["no-annotations", "other-annotations"])
def test_a_new_rule_is_one_check_that_edits_the_desired_pod(annotations: dict[str, str] | None) -> None:
    # next to the real rules: both changes land in one patch, each with its warning; the request is untouched
    rule = Rule(id="GPU999", name="annotate", summary="", check=annotate)
    policy = Policy(PolicyConfig(), rules=(*RULES, rule))
    pod = make_pod([container("cuda", requests={"nvidia.com/gpu": 1})], annotations=annotations)
    original = copy.deepcopy(pod)
    decision = decide.review(policy, parse_review(review(pod)), Endpoint.MUTATE)
    assert pod == original
    patched = apply_patch(pod, decision.patch)
    assert patched["metadata"]["annotations"] == {**(annotations or {}), ANNOTATION: "true"}
    assert patched["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert decision.warnings == (
        'gpu-stack GPU001: container "cuda": set GPU limit nvidia.com/gpu=1 from its request',
        f"gpu-stack GPU999: added annotation {ANNOTATION}",
    )
    assert decide.review(policy, parse_review(review(patched)), Endpoint.MUTATE).patch == ()
