"""The generated policies evaluated offline, as the API server would: cel-expr-python (Google's cel-cpp)
with the strings and optional extensions, plus the few Kubernetes library functions they use, here in
Python: `isQuantity`, `quantity` (with `isInteger`, `asInteger`, `compareTo`), `lists.range`,
`flatten`, `sum`, `min` and, for mutations, `jsonpatch.escapeKey`.

A quantity is carried as its exact decimal string offline (cel-cpp holds no Python objects); quantities
are parsed with the webhook's own parser (pod.parse_count), so a verdict that differs from the Python
rule is a difference in the rule's logic, not in number parsing. The API server type-checks the same
expressions against the real Kubernetes library (tests/e2e/test_cel_policies.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from functools import lru_cache
from typing import Any

import jsonpatch
from cel_expr_python import cel
from cel_expr_python.ext import ext_optional, ext_strings

from gpu_stack_webhook.cel.library import lower_binds
from gpu_stack_webhook.cel.render import policy_variables
from gpu_stack_webhook.policy.cel_twin import Variable
from gpu_stack_webhook.policy.pod import parse_count


class CelError(Exception):
    """An expression failed to compile or to evaluate (the API server applies failurePolicy)."""


def _decimal(text: str) -> Decimal:
    value = parse_count(text)
    if value is None:
        raise ValueError(f"quantities must match the regular expression: {text!r}")
    return value


def _quantity(text: str) -> str:
    return str(_decimal(text))


def _compare(a: str, b: str) -> int:
    x, y = Decimal(a), Decimal(b)
    return (x > y) - (x < y)


def _as_integer(q: str) -> int:
    value = Decimal(q)
    if value != value.to_integral_value():
        raise ValueError(f"cannot convert value to integer: {q}")
    return int(value)


def _escape_key(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


_T = cel.Type
_LIST = _T.List(_T.DYN)


def _overload(name: str, result: Any, params: Sequence[Any], impl: Callable[..., Any], member: bool) -> Any:
    return cel.FunctionDecl(name, [cel.Overload(f"k8s_{name.replace('.', '_')}", result, list(params),
                                                is_member=member, impl=impl)])


KUBERNETES_LIBRARY = (
    _overload("isQuantity", _T.BOOL, [_T.STRING], lambda s: parse_count(s) is not None, False),
    _overload("quantity", _T.STRING, [_T.STRING], _quantity, False),
    _overload("isInteger", _T.BOOL, [_T.STRING], lambda q: Decimal(q) == Decimal(q).to_integral_value(), True),
    _overload("asInteger", _T.INT, [_T.STRING], _as_integer, True),
    _overload("compareTo", _T.INT, [_T.STRING, _T.STRING], _compare, True),
    _overload("lists.range", _LIST, [_T.INT], lambda n: list(range(n)), False),
    _overload("flatten", _LIST, [_LIST], lambda items: [x for sub in items for x in sub], True),
    _overload("sum", _T.DYN, [_LIST], sum, True),
    _overload("min", _T.DYN, [_LIST], min, True),
    _overload("jsonpatch.escapeKey", _T.STRING, [_T.STRING], _escape_key, False),
)

# JSONPatch{op: ..., path: ..., value: ...} (cel_twin.patch_op) as a plain map offline.
_JSONPATCH = re.compile(r"JSONPatch\{op: ")


@lru_cache(maxsize=1)  # the one environment every expression is compiled in
def _env() -> Any:
    return cel.NewEnv(
        variables={"object": _T.DYN, "oldObject": _T.DYN, "variables": _T.Map(_T.STRING, _T.DYN)},
        extensions=[ext_strings.ExtStrings(), ext_optional.ExtOptional()],
        functions=list(KUBERNETES_LIBRARY),
    )


# The chart's policies hold a few dozen distinct expressions, and each policy config adds its config variables
# as JSON literals (bind_variables): the CEL property tests compile 79 over 100 generated configs. 512 keeps
# every expression of a run compiled while a long fuzz run with many configs cannot grow the process without
# bound; an expression evicted is only compiled again.
@lru_cache(maxsize=512)
def _compiled(expression: str) -> Any:
    text = lower_binds(expression)
    if "JSONPatch{" in text:
        text = _JSONPATCH.sub("{'op': ", text).replace(", path: ", ", 'path': ").replace(", value: ", ", 'value': ")
    try:
        return _env().compile(text)
    except Exception as error:
        raise CelError(f"compile: {error}") from None


def evaluate(expression: str, obj: Mapping[str, Any] | None, variables: Mapping[str, Any],
             old: Mapping[str, Any] | None = None) -> Any:
    try:
        result = _compiled(expression).eval(data={"object": obj, "oldObject": old, "variables": dict(variables)})
        failed = result.type() == _T.ERROR  # cel-cpp returns an evaluation error as a value
        value = result.plain_value()
    except CelError:
        raise
    except Exception as error:
        raise CelError(f"{expression[:60]}...: {error}") from None
    if failed:
        raise CelError(f"{expression[:60]}...: {value}")
    return value


def bind_variables(variables: Sequence[Variable], config: Mapping[str, Any], obj: Mapping[str, Any],
                   old: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Evaluate a policy's variables in order (config variables are JSON literals, as the chart renders)."""
    bound: dict[str, Any] = {}
    for name, expression in variables:
        if old is None and name.startswith("old"):
            continue  # render.py's copies on oldObject; the API server evaluates them lazily, on UPDATE only
        if name in config:
            bound[name] = evaluate(json.dumps(config[name]), obj, bound, old)
        else:
            bound[name] = evaluate(expression, obj, bound, old)
    return bound


def violations(policy: Any, config: Mapping[str, Any], obj: Mapping[str, Any],
               old: Mapping[str, Any] | None = None) -> list[str]:
    """The denial texts of one validating policy for `obj` (an UPDATE when `old` is given)."""
    return list(bind_variables(policy_variables(policy), config, obj, old)["violations"])


def mutate(policy: Any, config: Mapping[str, Any], pod: Mapping[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """One mutating policy applied to a Pod being created: (the patched pod, the JSONPatch ops)."""
    bound = bind_variables(policy_variables(policy), config, pod)
    ops = [{"op": op["op"], "path": op["path"], "value": op["value"]} for op in evaluate(policy.patch, pod, bound)]
    return jsonpatch.apply_patch(pod, ops), ops
