"""The webhook configurations' matchConditions skip only requests the webhook would let through untouched.

For every overlay's policy (the ConfigMap the chart renders for it) and the test configs with the NVIDIA
runtime as the default runtime and not, on generated pods and workloads (tests/property/strategies.py)
and on every manifest of hack/demo/manifests:

- where the generated condition (cel/match_conditions.py, evaluated offline as the chart renders it) is
  false, the webhook's own answer is allowed, with no patch and no warning: /validate for every judged
  kind, CREATE and UPDATE; /mutate for Pods being created;
- the condition holds wherever the Python predicates of the rules' signals do (policy/scope.py): the
  CEL is at least as wide as what the rules read;
- each rule, run on its own, reports nothing and changes nothing on a pod or workload that carries none of the
  signals of its SCOPE: the contract the engine's scope gate (policy/engine.py) rests on, checked on the rule
  itself, since through the webhook the gate would answer for it.

`make test` runs MATCH_EXAMPLES (default 10,000) creates and a fifth of that as updates, derandomized;
`make fuzz` runs CEL_FUZZ_EXAMPLES (default 10,000) random ones. The API server evaluates the same
expressions in make e2e (tests/e2e/test_match_conditions.py), cost limits included.
"""

from __future__ import annotations

import base64
import json
import os
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_dev.chartlib import FULLNAME, one, overlays, render
from gpu_stack_webhook.cel import match_conditions, runtime
from gpu_stack_webhook.cel.library import config_values
from gpu_stack_webhook.policy import signals
from gpu_stack_webhook.policy.config import PolicyConfig, parse_config
from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.pod import PodView
from gpu_stack_webhook.policy.rules import RULES
from gpu_stack_webhook.policy.scope import in_scope, object_in_scope
from gpu_stack_webhook.server.app import AppConfig, create_app
from hypothesis import given, settings
from hypothesis import strategies as st

from . import counting
from .strategies import API, claims, pods, review_body, wrap
from .test_properties import CONFIGS

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "hack" / "demo" / "manifests").glob("*.yaml"))
_FUZZING = settings.get_current_profile_name() == "fuzz"
EXAMPLES = int(os.environ.get("CEL_FUZZ_EXAMPLES", "10000")) if _FUZZING else int(
    os.environ.get("MATCH_EXAMPLES", "10000"))
CASES = settings(max_examples=EXAMPLES)


@cache
def _overlay_policy(overlay: str) -> dict[str, Any]:
    objects = render(4, overlay).objects()
    document = yaml.safe_load(one(objects, "ConfigMap", f"{FULLNAME}-webhook-policy")["data"]["policy.yaml"])
    assert isinstance(document, dict)
    return document


def _config_documents() -> dict[str, dict[str, Any]]:
    documents = {f"overlay:{name}": _overlay_policy(name) for name in overlays()}
    for name, document in CONFIGS.items():
        for default in (True, False):
            documents[f"{name}:nvidiaRuntimeIsDefault={default}"] = {**document, "nvidiaRuntimeIsDefault": default}
    documents["mps:GPU006-disabled"] = {**CONFIGS["mps"], "nvidiaRuntimeIsDefault": False,
                                        "rules": {"disabled": ["GPU006"]}}
    documents["default:GPU002,GPU007-disabled"] = {"rules": {"disabled": ["GPU002", "GPU007"]}}
    documents["dra:GPU009-disabled"] = {**CONFIGS["dra"], "rules": {"disabled": ["GPU009"]}}
    # Declared non-GPU runtime classes, the live read not knowing one (gvisor) or failing: either would make a
    # pod naming it a GPU pod (GPU010) if the declaration were not trusted, and the conditions do not send it.
    declared = {"nonGpuRuntimeClassNames": ["gvisor", "runc"], "nvidiaRuntimeIsDefault": False}
    documents["declared-non-gpu:live"] = {**declared, "runtimeClasses": {
        "handlers": {"nvidia": "nvidia", "nvidia-cdi": "nvidia-cdi", "runc": "runc"}}}
    documents["declared-non-gpu:read-failed"] = {**declared, "runtimeClasses": {"error": "forbidden"}}
    return documents


DOCUMENTS = _config_documents()
config_names = st.sampled_from(sorted(DOCUMENTS))


@cache
def _config(name: str) -> PolicyConfig:
    return parse_config(DOCUMENTS[name], name)


@cache
def _client(name: str) -> Any:
    return create_app(AppConfig(policy=_config(name))).test_client()


@cache
def _expression(name: str, mutating: bool) -> str:
    return match_conditions.expression(mutating, config_values(_config(name)))


def called(name: str, obj: dict[str, Any], *, mutating: bool) -> bool:
    """Would the API server call the webhook for `obj`?"""
    result = runtime.evaluate(_expression(name, mutating), obj, {})
    assert isinstance(result, bool)
    return result


def answer(name: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = _client(name).post(path, data=json.dumps(body), content_type="application/json")
    assert reply.status_code == 200, reply.data[:300]
    response = json.loads(reply.data)["response"]
    assert isinstance(response, dict)
    return response


def assert_untouched(response: dict[str, Any], why: str) -> None:
    patch = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    assert (response["allowed"], patch, response.get("warnings", [])) == (True, [], []), (
        f"the matchConditions skip this request ({why}), but the webhook answers {response}")


def check_skipped_requests(name: str, obj: dict[str, Any], old: dict[str, Any] | None = None) -> None:
    kind = obj["kind"]
    if not called(name, obj, mutating=False):
        operation = "UPDATE" if old is not None else "CREATE"
        assert_untouched(answer(name, "/validate", review_body(obj, operation=operation, old=old)),
                         f"/validate {operation} {kind}")
    if kind == "Pod" and old is None and not called(name, obj, mutating=True):
        assert_untouched(answer(name, "/mutate", review_body(obj)), "/mutate CREATE Pod")


def check_wider_than_the_rules(name: str, obj: dict[str, Any]) -> None:
    config = _config(name)
    context = Context.for_config(config)
    for mutating in (True, False):
        if in_scope(PodView.of(obj, obj["kind"]), context, mutating=mutating):
            assert called(name, obj, mutating=mutating), (name, mutating, obj)


@CASES
@given(config_names, pods(), st.sampled_from(tuple(API)))
def test_skipped_creates_get_nothing_from_the_webhook(name: str, pod: dict[str, Any], kind: str) -> None:
    counting.tick()
    obj = wrap(pod, kind)
    check_skipped_requests(name, obj)
    check_wider_than_the_rules(name, obj)


@settings(max_examples=max(EXAMPLES // 5, 100))
@given(config_names, pods(), st.sampled_from(tuple(API)), st.booleans())
def test_a_rule_outside_its_scope_reports_and_changes_nothing(name: str, pod: dict[str, Any], kind: str,
                                                              patching: bool) -> None:
    counting.tick()
    obj = wrap(pod, kind)
    can_patch = patching and kind == "Pod"
    context = Context.for_config(_config(name), can_patch=can_patch)
    for rule in RULES:
        view = PodView.of(obj, kind, patchable=can_patch)
        if any(signals.SIGNALS[signal].python(view, context) for signal in rule.scope):
            continue
        assert (list(rule.check(view, context)), view.desired.patch()) == ([], ()), (name, rule.id, obj)


@settings(max_examples=max(EXAMPLES // 5, 100))
@given(config_names, pods(), pods(), st.sampled_from(tuple(API)))
def test_skipped_updates_get_nothing_from_the_webhook(name: str, new: dict[str, Any], old: dict[str, Any],
                                                      kind: str) -> None:
    counting.tick()
    obj, previous = wrap(new, kind), wrap(old, kind)
    previous["metadata"] = dict(obj["metadata"])
    check_skipped_requests(name, obj, previous)


@settings(max_examples=max(EXAMPLES // 10, 100))
@given(config_names, claims())
def test_dra_claims_are_sent_unless_gpu009_is_disabled(name: str, claim: dict[str, Any]) -> None:
    """ResourceClaims and ResourceClaimTemplates (Signal.DRA_OBJECT): sent while GPU009 is enabled; when the
    conditions skip one, the webhook answers allowed, no patch, no warning (CREATE at /mutate and /validate)."""
    counting.tick()
    enabled = object_in_scope(claim["kind"], Context.for_config(_config(name)))
    for mutating in (True, False):
        assert called(name, claim, mutating=mutating) is enabled, (name, mutating)
        if not enabled:
            path = "/mutate" if mutating else "/validate"
            assert_untouched(answer(name, path, review_body(claim)), f"{path} CREATE {claim['kind']}")


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_every_demo_manifest(name: str) -> None:
    for path in MANIFESTS:
        for obj in yaml.safe_load_all(path.read_text()):
            if obj and obj.get("kind") in API:
                check_skipped_requests(name, obj)
                check_wider_than_the_rules(name, obj)


def test_plain_pods_are_skipped_where_the_nvidia_runtime_is_not_the_default() -> None:
    """What the README promises for the chart's default layout: a pod without a GPU resource, GPU runtime
    class, MPS selection or CDI annotation is not sent, whatever its env or envFrom."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}, "spec": {"containers": [
        {"name": "web", "image": "nginx", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
         "envFrom": [{"configMapRef": {"name": "settings"}}]}]}}
    assert not called("overlay:default", pod, mutating=False)
    assert not called("overlay:default", pod, mutating=True)
    # Where the NVIDIA runtime runs every pod, that environment selects GPUs: /validate is asked.
    assert called("overlay:preinstalled-driver-toolkit.yaml", pod, mutating=False)
    assert not called("overlay:preinstalled-driver-toolkit.yaml", pod, mutating=True)
    gpu = json.loads(json.dumps(pod))
    gpu["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    assert called("overlay:default", gpu, mutating=False) and called("overlay:default", gpu, mutating=True)


def test_a_runtime_class_alone_is_sent_to_validate_only() -> None:
    """A sandboxed pod without GPUs (gVisor, Kata: a runtime class not declared non-GPU) is sent to /validate,
    which reads the class's handler, and not to /mutate: no mutating rule changes a pod for its runtime class."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sandboxed"}, "spec": {
        "runtimeClassName": "gvisor", "containers": [{"name": "app", "image": "busybox"}]}}
    assert called("overlay:default", pod, mutating=False)
    assert not called("overlay:default", pod, mutating=True)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    assert called("overlay:default", pod, mutating=True)


def test_pods_beyond_the_size_bounds_are_sent_unread() -> None:
    many = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "many"}, "spec": {"containers": [
        {"name": f"c{i}", "image": "busybox"} for i in range(signals.MAX_CONTAINERS + 1)]}}
    assert called("overlay:default", many, mutating=True)
    many["spec"]["containers"].pop()
    assert not called("overlay:default", many, mutating=True)
