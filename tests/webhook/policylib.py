"""Policy configs and the real policy engine run the way the tests look at it.

- `make_config(...)`, `config_*()`: the configs the rule tables use (default, time-slicing, MPS, MIG, per-node).
- `evaluate(...)`, `findings(...)`, `decide(...)`: what the engine finds, and the Decision /validate or
  /mutate returns, for an object.
- `only(found)`, `summary(found)`: the single finding of a list; (rule, severity, path) per finding.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpu_stack_webhook.admission import decide as admission_decide
from gpu_stack_webhook.admission.decide import Decision, Endpoint
from gpu_stack_webhook.admission.review import parse_review
from gpu_stack_webhook.policy.config import PolicyConfig, parse_config
from gpu_stack_webhook.policy.engine import Evaluation, Policy
from gpu_stack_webhook.policy.findings import Finding
from gpu_stack_webhook.policy.rules import RULES

from .podlib import GPU, review

CONFIG_LABEL = "nvidia.com/device-plugin.config"
CUSTOM_CONFIG_LABEL = "example.com/gpu-sharing"


def _device_plugin(mig: str = "none", *, time_slicing: Any = None, mps: Any = None) -> dict[str, Any]:
    cfg: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": mig}}
    sharing = {}
    if time_slicing is not None:
        sharing["timeSlicing"] = time_slicing
    if mps is not None:
        sharing["mps"] = mps
    if sharing:
        cfg["sharing"] = sharing
    return cfg


def time_slicing(
    replicas: int = 4,
    *,
    fail: bool = True,
    rename_by_default: bool = False,
    resource: str = GPU,
    rename: str | None = None,
) -> dict[str, Any]:
    res: dict[str, Any] = {"name": resource, "replicas": replicas}
    if rename:
        res["rename"] = rename
    return {"renameByDefault": rename_by_default, "failRequestsGreaterThanOne": fail, "resources": [res]}


def mps_sharing(replicas: int = 10, *, rename_by_default: bool = False) -> dict[str, Any]:
    return {"renameByDefault": rename_by_default, "resources": [{"name": GPU, "replicas": replicas}]}


def make_config(data: Mapping[str, Any] | None = None, **overrides: Any) -> PolicyConfig:
    """parse_config over a dict; keyword overrides are top-level keys (Python names, e.g. exemptNamespaces=...)."""
    merged = {**(dict(data) if data else {}), **overrides}
    return parse_config(merged, "<test>")


def single_config(device_plugin: Mapping[str, Any], **overrides: Any) -> PolicyConfig:
    """Every node runs the same device plugin config."""
    return make_config({"sharing": {"configs": {"default": dict(device_plugin)}}}, **overrides)


def config_default(**overrides: Any) -> PolicyConfig:
    return make_config(**overrides)


def config_time_slicing(replicas: int = 4, *, fail: bool = True, **kw: Any) -> PolicyConfig:
    """Time-slicing x4 on every node; with failRequestsGreaterThanOne unless fail=False."""
    return single_config(_device_plugin(time_slicing=time_slicing(replicas, fail=fail, **kw)))


def config_mps(replicas: int = 10, **overrides: Any) -> PolicyConfig:
    """MPS x10 on every node."""
    return single_config(_device_plugin(mps=mps_sharing(replicas)), **overrides)


def config_mig(strategy: str, **overrides: Any) -> PolicyConfig:
    """migStrategy none | single | mixed on every node."""
    return single_config(_device_plugin(strategy), **overrides)


def config_per_node(label: str = CONFIG_LABEL, **overrides: Any) -> PolicyConfig:
    """Named configs chosen per node by `label`: an exclusive default plus one of each kind of sharing."""
    return make_config(
        {
            "sharing": {
                "nodeConfigLabel": label,
                "defaultConfig": "default",
                "configs": {
                    "default": _device_plugin(),
                    "ts-x4": _device_plugin(time_slicing=time_slicing(4, fail=True)),
                    "ts-x4-lenient": _device_plugin(time_slicing=time_slicing(4, fail=False)),
                    "mps-x10": _device_plugin(mps=mps_sharing(10)),
                    "mig-mixed": _device_plugin("mixed"),
                    "mig-single": _device_plugin("single"),
                },
            }
        },
        **overrides,
    )


# --------------------------------------------------------------------------------------------------
# Running the engine
# --------------------------------------------------------------------------------------------------


def evaluate(
    obj: Mapping[str, Any], kind: str = "Pod", config: PolicyConfig | None = None, *, can_patch: bool = False
) -> Evaluation:
    return Policy(config or PolicyConfig()).evaluate(obj, kind, can_patch=can_patch)



def rule_patch(obj: Mapping[str, Any], rule_id: str, config: PolicyConfig | None = None) -> list[dict[str, Any]]:
    """The JSONPatch /mutate sends for a Pod CREATE of `obj` when `rule_id` is the only rule enabled."""
    policy = Policy(config or PolicyConfig(), rules=[r for r in RULES if r.id == rule_id])
    return list(policy.evaluate(obj, "Pod", can_patch=True).patch)


def findings(
    obj: Mapping[str, Any],
    rule_id: str | None = None,
    kind: str = "Pod",
    config: PolicyConfig | None = None,
    *,
    can_patch: bool = False,
) -> list[Finding]:
    """The findings of one rule (or all) for `obj`, as /validate (can_patch False) or /mutate of a Pod CREATE."""
    return [f for f in evaluate(obj, kind, config, can_patch=can_patch).findings if rule_id in (None, f.rule_id)]


def decide(
    obj: Mapping[str, Any] | None,
    endpoint: Endpoint | str = Endpoint.VALIDATE,
    config: PolicyConfig | None = None,
    **review_kw: Any,
) -> Decision:
    """The Decision /mutate or /validate returns for an AdmissionReview built by `review`."""
    endpoint = Endpoint(endpoint) if isinstance(endpoint, str) else endpoint
    request = parse_review(review(obj, **review_kw))
    return admission_decide.review(Policy(config or PolicyConfig()), request, endpoint)


def only(found: Sequence[Finding]) -> Finding:
    """The single finding of a list, with every finding's text in the failure message."""
    assert len(found) == 1, f"expected exactly one finding, got {[f.text for f in found]}"
    return found[0]


def summary(found: Iterable[Finding]) -> list[tuple[str, str, str]]:
    """(rule ID, severity, field path) per finding: what a table test compares."""
    return [(f.rule_id, f.severity.value, f.path) for f in found]
