"""GPU005 mig-resource-exposed: a nvidia.com/mig-* name must be exposed by some config the pod can land on."""

from __future__ import annotations

from typing import Any

import pytest
from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.findings import Severity

from .podlib import ALL_KINDS, CONTAINER_KINDS, CONTAINER_LABEL, GPU, SPEC_PATH, container, make_pod, pod_with, wrap
from .policylib import CONFIG_LABEL, config_default, config_mig, config_per_node, decide, findings, make_config, only

RULE = "GPU005"
MIG = "nvidia.com/mig-1g.5gb"


def slice_(resource: str = MIG, n: Any = 1, name: str = "x") -> dict[str, Any]:
    return container(name, requests={resource: n}, limits={resource: n})


PER_NODE = config_per_node()

# (config, container, pod spec fields, expected severity or None, words in the message)
CASES = [
    # migStrategy none: no MIG resource exists, the pod would stay Pending forever -> deny, hint mixed
    pytest.param(config_mig("none"), slice_(), {}, "deny", ("migStrategy none", "needs migStrategy mixed"),
                 id="none-denied"),
    # the default config is migStrategy none too -> deny
    pytest.param(config_default(), slice_(), {}, "deny", ("migStrategy none",), id="default-denied"),
    # single exposes MIG slices as nvidia.com/gpu -> deny, hint nvidia.com/gpu
    pytest.param(config_mig("single"), slice_(), {}, "deny", ("migStrategy single", "use nvidia.com/gpu"),
                 id="single-denied"),
    # mixed exposes every profile as its own resource -> allowed
    pytest.param(config_mig("mixed"), slice_(), {}, None, (), id="mixed-allowed"),
    # any profile name under mixed -> allowed
    pytest.param(config_mig("mixed"), slice_("nvidia.com/mig-3g.40gb"), {}, None, (), id="mixed-other-profile"),
    # nvidia.com/gpu is not a MIG name -> not judged
    pytest.param(config_mig("none"), slice_(GPU), {}, None, (), id="plain-gpu-ignored"),
    # nvidia.com/gpu.shared is not a MIG name -> not judged by GPU005
    pytest.param(config_mig("none"), slice_("nvidia.com/gpu.shared"), {}, None, (), id="gpu.shared-ignored"),
    # migUnexposed: warn turns the denial into a warning
    pytest.param(config_mig("none", rules={"migUnexposed": "warn"}), slice_(), {}, "warn", ("migStrategy none",),
                 id="none-warn-by-config"),
    pytest.param(config_mig("single", rules={"migUnexposed": "warn"}), slice_(), {}, "warn", ("use nvidia.com/gpu",),
                 id="single-warn-by-config"),
    # per-node: unpinned, one candidate is mixed -> allowed (it can land there)
    pytest.param(PER_NODE, slice_(), {}, None, (), id="per-node-unpinned-allowed"),
    # per-node: pinned to the mixed config -> allowed
    pytest.param(PER_NODE, slice_(), {"nodeSelector": {CONFIG_LABEL: "mig-mixed"}}, None, (),
                 id="per-node-pinned-mixed-allowed"),
    # per-node: pinned to the single config -> deny
    pytest.param(PER_NODE, slice_(), {"nodeSelector": {CONFIG_LABEL: "mig-single"}}, "deny", ("migStrategy single",),
                 id="per-node-pinned-single-denied"),
    # per-node: pinned to the default (none) config -> deny
    pytest.param(PER_NODE, slice_(), {"nodeSelector": {CONFIG_LABEL: "default"}}, "deny", ("migStrategy none",),
                 id="per-node-pinned-default-denied"),
    # per-node: affinity over none + single: both strategies named, single's hint wins
    pytest.param(PER_NODE, slice_(), {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": CONFIG_LABEL, "operator": "In", "values": ["default", "mig-single"]}]}]}}}},
                 "deny", ("migStrategy none/single", "use nvidia.com/gpu"), id="per-node-affinity-none-single"),
    # mixed with the 1g.5gb profile time-sliced and renamed by default: the plugin advertises only
    # nvidia.com/mig-1g.5gb.shared, so the plain name never schedules -> deny
    pytest.param(make_config({"sharing": {"configs": {"default": {"flags": {"migStrategy": "mixed"}, "sharing": {
        "timeSlicing": {"renameByDefault": True, "resources": [{"name": MIG, "replicas": 2}]}}}}}}),
                 slice_(), {}, "deny", ("migStrategy mixed",), id="mixed-renamed-profile-denied"),
    # ... and the renamed name itself is exposed -> allowed
    pytest.param(make_config({"sharing": {"configs": {"default": {"flags": {"migStrategy": "mixed"}, "sharing": {
        "timeSlicing": {"renameByDefault": True, "resources": [{"name": MIG, "replicas": 2}]}}}}}}),
                 slice_(MIG + ".shared"), {}, None, (), id="mixed-renamed-profile-shared-allowed"),
    # only the limit names the slice -> still judged
    pytest.param(config_mig("none"), container("x", limits={MIG: 1}), {}, "deny", (), id="limit-only-denied"),
]


@pytest.mark.parametrize(("config", "c", "spec", "severity", "words"), CASES)
def test_mig_names(config: PolicyConfig, c: dict[str, Any], spec: dict[str, Any], severity: str | None,
                   words: tuple[str, ...]) -> None:
    found = findings(make_pod([c], **spec), RULE, config=config)
    if severity is None:
        assert found == []
        return
    f = only(found)
    assert (f.severity.value, f.path) == (severity, "spec.containers[0].resources")
    resource = next(iter((c.get("resources") or {}).get("limits") or {}))
    assert f.message.startswith(f'container "x": no node exposes {resource}')
    for word in words:
        assert word in f.message


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("field", CONTAINER_KINDS)
def test_every_container_kind_and_workload(field: str, kind: str) -> None:
    # a MIG slice under the default (none) strategy in any container of any workload -> deny at its path
    obj = wrap(pod_with(field, slice_()), kind)
    f = only(findings(obj, RULE, kind))
    assert (f.severity, f.path) == (Severity.DENY, f"{SPEC_PATH[kind]}.{field}[0].resources")
    assert f.message.startswith(f'{CONTAINER_LABEL[field]} "x": no node exposes {MIG}')


def test_denied_only_at_validate() -> None:
    # Kubernetes accepts an unknown extended resource (the pod just never schedules): /validate denies
    pod = make_pod([slice_()])
    assert decide(pod, "mutate").allowed
    decision = decide(pod, "validate")
    assert not decision.allowed and decision.message.startswith(f'GPU005 container "x": no node exposes {MIG}')


def test_warn_mode_allows_with_warning() -> None:
    # migUnexposed: warn -> allowed, the kubectl Warning names the rule
    decision = decide(make_pod([slice_()]), "validate", config_mig("none", rules={"migUnexposed": "warn"}))
    assert decision.allowed
    assert [w.split(":")[0] for w in decision.warnings] == ["gpu-stack GPU005"]


def test_disabled_rule_reports_nothing() -> None:
    # GPU005 disabled: the unexposed slice passes
    config = config_default(rules={"disabled": ["GPU005"]})
    assert findings(make_pod([slice_()]), RULE, config=config) == []
    assert decide(make_pod([slice_()]), "validate", config).allowed
