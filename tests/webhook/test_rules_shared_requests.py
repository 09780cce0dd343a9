"""GPU004 shared-gpu-single-request: no request above one for a shared GPU whose device plugin refuses it."""

from __future__ import annotations

from typing import Any

import pytest
from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.findings import Severity

from .podlib import ALL_KINDS, CONTAINER_KINDS, CONTAINER_LABEL, GPU, SPEC_PATH, container, make_pod, pod_with, wrap
from .policylib import (
    CONFIG_LABEL,
    CUSTOM_CONFIG_LABEL,
    config_default,
    config_mig,
    config_mps,
    config_per_node,
    config_time_slicing,
    decide,
    findings,
    make_config,
    only,
)

RULE = "GPU004"


def affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    """Required node affinity with one nodeSelectorTerm per argument (each a list of matchExpressions)."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}


def on(label: str, *values: str, op: str = "In") -> dict[str, Any]:
    return {"key": label, "operator": op, "values": list(values)}


def gpus(n: Any, resource: str = GPU, name: str = "x") -> dict[str, Any]:
    return container(name, requests={resource: n}, limits={resource: n})


TS = config_time_slicing()
TS_LENIENT = config_time_slicing(fail=False)
TS_RENAMED = config_time_slicing(rename_by_default=True)
TS_RENAME = config_time_slicing(rename="nvidia.com/gpu-ts")
MPS = config_mps()
PER_NODE = config_per_node()
CUSTOM = config_per_node(CUSTOM_CONFIG_LABEL)
MIG_MIXED_TS = make_config({"sharing": {"configs": {"default": {
    "version": "v1", "flags": {"migStrategy": "mixed"},
    "sharing": {"timeSlicing": {"failRequestsGreaterThanOne": True,
                                "resources": [{"name": "nvidia.com/mig-1g.5gb", "replicas": 2}]}}}}}})

# (config, container, pod spec fields, expected severity or None, words in the message)
CASES = [
    # time-sliced x4 with failRequestsGreaterThanOne, 2 replicas asked: the plugin fails the pod on the node -> deny
    pytest.param(TS, gpus(2), {}, "deny", ("requests 2 nvidia.com/gpu", "(config default)", "request 1"),
                 id="ts-fail-2-denied"),
    # exactly one replica -> allowed
    pytest.param(TS, gpus(1), {}, None, (), id="ts-fail-1-allowed"),
    # "1000m" is one -> allowed
    pytest.param(TS, gpus("1000m"), {}, None, (), id="ts-fail-1000m-allowed"),
    # "2k" is 2000 replicas -> deny, normalised in the message
    pytest.param(TS, gpus("2k"), {}, "deny", ("requests 2000 nvidia.com/gpu",), id="ts-fail-2k-denied"),
    # only a limit of 2 (the request is defaulted from it) -> deny
    pytest.param(TS, container("x", limits={GPU: 2}), {}, "deny", ("requests 2",), id="ts-fail-limit-only-denied"),
    # without failRequestsGreaterThanOne the plugin hands out 2 replicas: pointless but allowed
    pytest.param(TS_LENIENT, gpus(2), {}, None, (), id="ts-lenient-2-allowed"),
    # MPS always refuses more than one, whatever the flag says -> deny
    pytest.param(MPS, gpus(2), {}, "deny", ("(config default)",), id="mps-2-denied"),
    pytest.param(MPS, gpus(1), {}, None, (), id="mps-1-allowed"),
    # no sharing at all: 2 whole GPUs is a normal request -> allowed
    pytest.param(config_default(), gpus(2), {}, None, (), id="exclusive-2-allowed"),
    # renameByDefault: the shared resource is nvidia.com/gpu.shared; 2 of it -> deny
    pytest.param(TS_RENAMED, gpus(2, "nvidia.com/gpu.shared"), {}, "deny", ("nvidia.com/gpu.shared",),
                 id="renamed-gpu.shared-2-denied"),
    # with renameByDefault nvidia.com/gpu is no longer shared (not exposed at all) -> not GPU004's business
    pytest.param(TS_RENAMED, gpus(2), {}, None, (), id="renamed-plain-gpu-not-shared"),
    # an explicit rename: the pinned device plugin v0.20 ignores it (config.go DisableResourceNamingInConfig),
    # so the node still advertises the time-sliced replicas as nvidia.com/gpu -> 2 of those denied ...
    pytest.param(TS_RENAME, gpus(2), {}, "deny", ("nvidia.com/gpu",), id="explicit-rename-ignored-by-plugin"),
    # ... and the renamed name is never advertised: nothing to share, not GPU004's business
    pytest.param(TS_RENAME, gpus(2, "nvidia.com/gpu-ts"), {}, None, (), id="explicit-rename-not-advertised"),
    # a time-sliced MIG slice under mixed strategy -> deny above one
    pytest.param(MIG_MIXED_TS, gpus(2, "nvidia.com/mig-1g.5gb"), {}, "deny", ("nvidia.com/mig-1g.5gb",),
                 id="time-sliced-mig-slice-denied"),
    # per-node configs, no selector: could land on exclusive or lenient nodes too -> only a warning
    pytest.param(PER_NODE, gpus(2), {}, "warn", ("config ts-x4, mps-x10",), id="per-node-unpinned-warns"),
    # nodeSelector pins the time-slicing config -> deny
    pytest.param(PER_NODE, gpus(2), {"nodeSelector": {CONFIG_LABEL: "ts-x4"}}, "deny", ("config ts-x4)",),
                 id="nodeSelector-ts-denied"),
    # nodeSelector pins the lenient config -> allowed
    pytest.param(PER_NODE, gpus(2), {"nodeSelector": {CONFIG_LABEL: "ts-x4-lenient"}}, None, (),
                 id="nodeSelector-lenient-allowed"),
    # nodeSelector pins the exclusive default -> allowed
    pytest.param(PER_NODE, gpus(2), {"nodeSelector": {CONFIG_LABEL: "default"}}, None, (),
                 id="nodeSelector-default-allowed"),
    # a label value naming no config: the config-manager falls back to the default -> allowed
    pytest.param(PER_NODE, gpus(2), {"nodeSelector": {CONFIG_LABEL: "no-such-config"}}, None, (),
                 id="nodeSelector-unknown-falls-back-to-default"),
    # required affinity In [ts-x4] -> deny
    pytest.param(PER_NODE, gpus(2), {"affinity": affinity([on(CONFIG_LABEL, "ts-x4")])}, "deny", ("ts-x4",),
                 id="affinity-in-ts-denied"),
    # affinity In [ts-x4, mps-x10]: every candidate refuses -> deny
    pytest.param(PER_NODE, gpus(2), {"affinity": affinity([on(CONFIG_LABEL, "ts-x4", "mps-x10")])}, "deny",
                 ("mps-x10", "ts-x4"), id="affinity-in-two-refusing-denied"),
    # affinity In [ts-x4, default]: may land on an exclusive node -> warn
    pytest.param(PER_NODE, gpus(2), {"affinity": affinity([on(CONFIG_LABEL, "ts-x4", "default")])}, "warn",
                 ("ts-x4",), id="affinity-in-mixed-warns"),
    # two terms (ORed), both pinning refusing configs -> deny
    pytest.param(PER_NODE, gpus(2), {"affinity": affinity([on(CONFIG_LABEL, "ts-x4")], [on(CONFIG_LABEL, "mps-x10")])},
                 "deny", (), id="affinity-two-terms-both-refusing-denied"),
    # two terms, the second does not pin the label: any node is possible -> warn
    pytest.param(PER_NODE, gpus(2), {"affinity": affinity([on(CONFIG_LABEL, "ts-x4")], [on("zone", "a")])}, "warn",
                 (), id="affinity-unpinned-term-warns"),
    # NotIn does not pin anything -> warn
    pytest.param(PER_NODE, gpus(2), {"affinity": affinity([on(CONFIG_LABEL, "default", op="NotIn")])}, "warn", (),
                 id="affinity-notin-warns"),
    # a custom nodeConfigLabel: selecting on it pins the config -> deny
    pytest.param(CUSTOM, gpus(2), {"nodeSelector": {CUSTOM_CONFIG_LABEL: "ts-x4"}}, "deny", (),
                 id="custom-label-nodeSelector-denied"),
    # ... and the standard label means nothing then -> unpinned -> warn
    pytest.param(CUSTOM, gpus(2), {"nodeSelector": {CONFIG_LABEL: "ts-x4"}}, "warn", (),
                 id="custom-label-standard-label-ignored"),
]


@pytest.mark.parametrize(("config", "c", "spec", "severity", "words"), CASES)
def test_shared_requests(config: PolicyConfig, c: dict[str, Any], spec: dict[str, Any], severity: str | None,
                         words: tuple[str, ...]) -> None:
    found = findings(make_pod([c], **spec), RULE, config=config)
    if severity is None:
        assert found == []
        return
    f = only(found)
    assert (f.severity.value, f.path) == (severity, "spec.containers[0].resources")
    assert f.message.startswith('container "x" requests ')
    assert "shared GPUs allow 1" in f.message
    for word in words:
        assert word in f.message


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("field", CONTAINER_KINDS)
def test_every_container_kind_and_workload(field: str, kind: str) -> None:
    # 2 time-sliced replicas in any container of any workload's pod template -> deny at that container
    obj = wrap(pod_with(field, gpus(2)), kind)
    f = only(findings(obj, RULE, kind, TS))
    assert (f.severity, f.path) == (Severity.DENY, f"{SPEC_PATH[kind]}.{field}[0].resources")
    assert f.message.startswith(f'{CONTAINER_LABEL[field]} "x" requests 2 nvidia.com/gpu')


def test_each_container_judged_on_its_own() -> None:
    # two containers with 1 replica each are fine; a third with 3 is denied alone
    pod = make_pod([gpus(1, name="a"), gpus(1, name="b"), gpus(3, name="c")])
    f = only(findings(pod, RULE, config=TS))
    assert f.path == "spec.containers[2].resources" and 'container "c" requests 3' in f.message


def test_denied_only_at_validate() -> None:
    # Kubernetes accepts the pod; the device plugin would fail it on the node: /mutate allows, /validate denies
    pod = make_pod([gpus(2)])
    assert decide(pod, "mutate", TS).allowed
    decision = decide(pod, "validate", TS)
    assert not decision.allowed and decision.message.startswith("GPU004 ")


def test_warning_when_only_some_nodes_refuse() -> None:
    # unpinned pod with per-node configs: allowed with a warning
    decision = decide(make_pod([gpus(2)]), "validate", PER_NODE)
    assert decision.allowed
    assert len(decision.warnings) == 1 and decision.warnings[0].startswith("gpu-stack GPU004: ")


def test_disabled_rule_reports_nothing() -> None:
    # GPU004 disabled: 2 time-sliced replicas pass
    config = make_config({**TS.model_dump(by_alias=True), "rules": {"disabled": ["GPU004"]}})
    assert findings(make_pod([gpus(2)]), RULE, config=config) == []
    assert decide(make_pod([gpus(2)]), "validate", config).allowed


def test_mig_single_has_no_shared_resources() -> None:
    # migStrategy single exposes slices as nvidia.com/gpu, exclusively: 2 is fine
    assert findings(make_pod([gpus(2)]), RULE, config=config_mig("single")) == []
