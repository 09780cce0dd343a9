"""The agreement tests meet every rule: no CEL twin passes because the generated objects never tried it.

tests/property/test_cel_equivalence.py holds each CEL twin to its Python rule on generated objects; that
proves nothing for a rule the generator never exercises (a rule on a field `strategies.py` never sets is
never denied, so a broken twin agrees with it). Here, per rule with a CEL twin (policy/rules/, read from
the registry, so a new rule is met without being named):

- every field name its module reads (a string key in its Python `check`, a `.?field` or `has(x.field)`
  in its CEL) is a key of some generated object: a rule on `hostPID` fails until the generator makes pods
  with `hostPID`;
- over a fixed (derandomized) sample of generated objects, for Pods and for each workload kind, its
  ValidatingAdmissionPolicy's Python side denies some object and allows some other, and for Pods being
  created its MutatingAdmissionPolicy's Python side changes some pod and leaves some other alone (the
  ResourceClaims and ResourceClaimTemplates for a "dra" twin); on every object of the sample the CEL twin
  gives the same denial texts and the same mutated object, so a broken twin fails here too.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from gpu_stack_webhook.policy.rules import RULES, Rule
from hypothesis import HealthCheck, example, given, settings

from .strategies import API, claims, wrap
from .test_cel_equivalence import _policy, cel_denials, cel_mutated, config_names, gpu_pods, python_denials
from .test_properties import CONFIGS

TWINNED = tuple(r for r in RULES if r.cel_validation is not None or r.cel_mutation is not None)
# The sample each rule must meet: derandomized, so a pass or a fail is the same on every run.
SAMPLE = settings(max_examples=100, derandomize=True, database=None, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")
# Fields only a lookup reads (webhook only, docs/cel-mode.md): offline, with no lookup, the rules cannot judge
# them, so the generator leaves them out.
LOOKUP_ONLY = {
    "resourceClaims": "a pod's spec.resourceClaims name ResourceClaims the webhook reads from the API",
}
RULES_SOURCE = Path(__file__).resolve().parents[2] / "webhook" / "src" / "gpu_stack_webhook" / "policy" / "rules"


def _target(rule: Rule) -> str:
    twin = rule.cel_validation or rule.cel_mutation
    assert twin is not None
    return twin.target


def _strip_literals(cel: str) -> str:
    return re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", "''", cel)


def fields_read(rule: Rule) -> set[str]:
    """The object fields the rule's module names: string keys in Python (`x.get("f")`, `x["f"]`) and
    optional selections in its CEL (`x.?f`, `has(x.f)`)."""
    # The checkout's source (the installed module may be compiled): tests/conftest.py keeps them the same.
    source = RULES_SOURCE / f"{rule.check.__module__.rpartition('.')[2]}.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
        elif (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
              and isinstance(node.slice.value, str)):
            names.add(node.slice.value)
    for twin in (rule.cel_validation, rule.cel_mutation):
        if twin is None:
            continue
        texts = [expression for _name, expression in twin.variables]
        texts += [twin.patch] if hasattr(twin, "patch") else []
        for text in map(_strip_literals, texts):
            names |= set(re.findall(r"\.\?([A-Za-z_]\w*)", text))
            names |= set(re.findall(r"has\(\w+(?:\.\w+)*\.([A-Za-z_]\w*)\)", text))
    return names


def _keys(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, child in value.items():
            yield key
            yield from _keys(child)
    elif isinstance(value, list):
        for child in value:
            yield from _keys(child)


@cache
def _generated_keys(target: str) -> set[str]:
    strategy, kinds = (claims(), CLAIM_KINDS) if target == "dra" else (gpu_pods(), tuple(API))
    found: set[str] = set()

    @SAMPLE
    @given(obj=strategy)
    def collect(obj: dict[str, Any]) -> None:
        for kind in kinds:
            found.update(_keys(wrap(obj, kind) if kind in API else obj))

    collect()
    return found


@pytest.mark.parametrize("rule", TWINNED, ids=[r.id for r in TWINNED])
def test_the_generator_sets_every_field_a_twinned_rule_reads(rule: Rule) -> None:
    missing = sorted(fields_read(rule) - _generated_keys(_target(rule)) - set(LOOKUP_ONLY))
    assert not missing, (
        f"{rule.id} reads {missing}, which no object of tests/property/strategies.py has: the property tests "
        f"cannot compare {rule.id}'s CEL twin with its Python check there. Add them to the generator's pools.")


def _never(tally: dict[str, set[str]], outcomes: tuple[str, ...], rules: tuple[Rule, ...]) -> list[str]:
    return [f"{r.id} never {outcome}" for r in rules for outcome in outcomes if outcome not in tally[r.id]]


def _advice(kind: str) -> str:
    return (f"across the generated {kind} objects of tests/property/strategies.py: extend the generator so that "
            "the CEL equivalence tests meet the rule both ways")


@pytest.mark.parametrize("kind", tuple(API))
def test_every_validation_twin_denies_and_allows_a_generated_object_of_each_kind(kind: str) -> None:
    rules = tuple(r for r in TWINNED if r.cel_validation is not None and _target(r) == "pods")
    tally: dict[str, set[str]] = defaultdict(set)

    @SAMPLE
    @given(pod=gpu_pods(), config=config_names)
    def judge(pod: dict[str, Any], config: str) -> None:
        obj = wrap(pod, kind)
        python = python_denials(config, obj)
        assert cel_denials(config, obj) == python
        for rule in rules:
            tally[rule.id].add("denied" if any(text.startswith(f"{rule.id} ") for text in python) else "allowed")

    judge()
    never = _never(tally, ("denied", "allowed"), rules)
    assert not never, f"{', '.join(never)} {_advice(kind)}"


PLAIN_GPU_POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain", "namespace": "gpu-demo"},
                 "spec": {"containers": [{"name": "main", "image": "cuda:12",
                                          "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def test_every_mutation_twin_changes_and_leaves_alone_a_generated_pod() -> None:
    """Each pod under every config: a mutation is often config-bound (GPU008 needs injectRuntimeClassName)."""
    rules = tuple(r for r in TWINNED if r.cel_mutation is not None and _target(r) == "pods")
    tally: dict[str, set[str]] = defaultdict(set)

    @settings(SAMPLE, max_examples=40)
    @given(pod=gpu_pods())
    # A one-GPU pod with no runtime class, which no rule denies early: GPU008 changes it under `runtime-class`.
    # Few generated pods are that plain (about 1 in 100), and which ones the derandomized sample draws is not
    # the same in every run of the whole suite, so without it the test failed in one `make test` and not alone.
    @example(pod=PLAIN_GPU_POD)
    def mutate(pod: dict[str, Any]) -> None:
        for config in CONFIGS:
            evaluation = _policy(config).evaluate(pod, "Pod", can_patch=True)
            if any(f.deny_early for f in evaluation.denials):
                continue  # /mutate denies: test_cel_equivalence says which of those CEL leaves alone
            assert cel_mutated(config, pod) == jsonpatch.apply_patch(pod, evaluation.patch), config
            changed = {f.rule_id for f in evaluation.findings if f.changed}
            for rule in rules:
                tally[rule.id].add("changed a pod" if rule.id in changed else "left a pod alone")

    mutate()
    never = _never(tally, ("changed a pod", "left a pod alone"), rules)
    assert not never, f"{', '.join(never)} {_advice('Pod')}"


@pytest.mark.parametrize("kind", CLAIM_KINDS)
def test_every_dra_twin_denies_allows_and_changes_a_generated_claim(kind: str) -> None:
    rules = tuple(r for r in TWINNED if _target(r) == "dra")
    tally: dict[str, set[str]] = defaultdict(set)

    @settings(SAMPLE, max_examples=40)
    @given(claim=claims().filter(lambda c: c["kind"] == kind))
    def judge(claim: dict[str, Any]) -> None:
        for config in CONFIGS:  # the MPS memory-limit default is config-bound (dra.mpsDefaultPinnedDeviceMemoryLimit)
            python = python_denials(config, claim)
            assert cel_denials(config, claim) == python, config
            evaluation = _policy(config).evaluate(claim, kind, can_patch=True)
            assert cel_mutated(config, claim) == jsonpatch.apply_patch(claim, evaluation.patch), config
            changed = {f.rule_id for f in evaluation.findings if f.changed}
            for rule in rules:
                tally[rule.id].add("denied" if any(t.startswith(f"{rule.id} ") for t in python) else "allowed")
                tally[rule.id].add("changed a claim" if rule.id in changed else "left a claim alone")

    judge()
    never = [*_never(tally, ("denied", "allowed"), tuple(r for r in rules if r.cel_validation is not None)),
             *_never(tally, ("changed a claim", "left a claim alone"),
                     tuple(r for r in rules if r.cel_mutation is not None))]
    assert not never, f"{', '.join(never)} {_advice(kind)}"
