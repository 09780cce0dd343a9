"""Policy config validation: defaults, the example file, and errors that name the bad key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_webhook.policy.config import ConfigError, PolicyConfig, load_config, parse_config
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.policy.rules import RULE_IDS, RULES
from gpu_stack_webhook.policy.sharing import SharingIndex, Strategy

from .recordlib import REPO_ROOT

EXAMPLE = REPO_ROOT / "webhook" / "examples" / "policy.yaml"


def test_defaults() -> None:
    # no config at all: every rule on, gpu, gpu.shared and mig-* GPUs, chart + kube-system exempt,
    # one exclusive default config
    config = parse_config(None)
    assert config == PolicyConfig() == parse_config({})
    assert config.gpu_resources.prefixes == ("nvidia.com/mig-",)
    assert config.gpu_resources.names == ("nvidia.com/gpu", "nvidia.com/gpu.shared")
    assert config.gpu_runtime_class_names == ("nvidia",)
    assert config.exempt_namespaces == ("gpu-stack", "kube-system")
    assert config.rules.disabled == () and config.rules.mig_unexposed == "deny"
    assert config.sharing.node_config_label == "nvidia.com/device-plugin.config"
    assert config.sharing.default_config == "default" and list(config.sharing.configs) == ["default"]
    assert config.sharing.configs["default"].flags.mig_strategy == "none"
    assert config.mps.annotation == "gpu-stack.io/mps"
    assert dict(config.mps.node_selector) == {"nvidia.com/mps.capable": "true"}
    assert [t.as_k8s() for t in config.mps.tolerations] == [
        {"key": "gpu-stack.io/mps", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert config.mps.inject_host_ipc is True
    # 2 objects x 6 (Go's \u003c escapes) x 1.5 MiB (etcd's request limit) + 1 MiB of envelope
    assert config.max_request_bytes == 2 * 6 * 1536 * 1024 + 1024 * 1024 == 19 * 1024 * 1024
    # The rule IDs are GPU001 up to the number of rule modules: none twice, none skipped.
    assert {f"GPU{i:03}" for i in range(1, len(RULE_IDS) + 1)} == RULE_IDS
    assert config.inject_runtime_class_name == ""


def test_example_file_parses_and_matches_its_comments() -> None:
    # webhook/examples/policy.yaml: "these are the defaults except where noted" (mps-x10 is the noted example)
    config = load_config(EXAMPLE)
    defaults = PolicyConfig()
    assert config.model_dump(exclude={"sharing"}) == defaults.model_dump(exclude={"sharing"})
    assert sorted(config.sharing.configs) == ["default", "mps-x10"]
    index = SharingIndex(config)
    mps = index.configs["mps-x10"].exposed["nvidia.com/gpu"]
    assert (mps.strategy, mps.replicas, mps.fail_requests_greater_than_one) == (Strategy.MPS, 10, True)
    assert index.mps_config_names == frozenset({"mps-x10"})


def test_no_path_means_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the policy layer reads no environment: $GPU_STACK_WEBHOOK_CONFIG is the caller's (settings.py)
    path = tmp_path / "policy.yaml"
    path.write_text("exemptNamespaces: [ops]\n", encoding="utf-8")
    monkeypatch.setenv("GPU_STACK_WEBHOOK_CONFIG", str(path))
    assert load_config() == load_config(None) == PolicyConfig()


def test_empty_file_means_defaults(tmp_path: Path) -> None:
    # an empty ConfigMap key (or only comments) is the defaults, not an error
    path = tmp_path / "policy.yaml"
    path.write_text("# nothing set\n", encoding="utf-8")
    assert load_config(path) == PolicyConfig()


# (document, words the error must contain) -- each error names the offending key path
BAD = [
    # a MIG strategy the device plugin does not know
    pytest.param({"sharing": {"configs": {"default": {"flags": {"migStrategy": "both"}}}}},
                 ("sharing.configs.default.flags.migStrategy",), id="migStrategy-bad-value"),
    # a typo at the top level
    pytest.param({"exemptNamespace": ["x"]}, ("exemptNamespace", "Extra inputs are not permitted"),
                 id="unknown-top-key"),
    # a typo inside a strict section
    pytest.param({"mps": {"injectHostIpc": False}}, ("mps.injectHostIpc",), id="unknown-mps-key"),
    # migUnexposed only deny|warn
    pytest.param({"rules": {"migUnexposed": "ignore"}}, ("rules.migUnexposed",), id="migUnexposed-bad"),
    # defaultConfig naming no config
    pytest.param({"sharing": {"defaultConfig": "gpu", "configs": {"ts": {}}}}, ("sharing", "defaultConfig 'gpu'",
                 "['ts']"), id="defaultConfig-missing"),
    # a device plugin config version we do not understand
    pytest.param({"sharing": {"configs": {"default": {"version": "v2"}}}}, ("sharing.configs.default.version",),
                 id="device-plugin-version"),
    # replicas must be at least 1
    pytest.param({"sharing": {"configs": {"default": {"sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 0}]}}}}}},
                 ("sharing.configs.default.sharing.timeSlicing.resources[0].replicas",), id="replicas-zero"),
    # both time-slicing and MPS listing resources in one config
    pytest.param({"sharing": {"configs": {"default": {"sharing": {
        "timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]},
        "mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}}}},
                 ("sharing.configs.default.sharing", "cannot both"), id="timeslicing-and-mps"),
    # a toleration operator Kubernetes does not have
    pytest.param({"mps": {"tolerations": [{"key": "k", "operator": "In"}]}}, ("mps.tolerations[0].operator",),
                 id="toleration-operator"),
    # maxRequestBytes below the floor
    pytest.param({"maxRequestBytes": 10}, ("maxRequestBytes",), id="max-request-bytes-small"),
    # a list where a mapping is expected
    pytest.param({"gpuResources": ["nvidia.com/"]}, ("gpuResources",), id="gpuResources-list"),
]


@pytest.mark.parametrize(("data", "words"), BAD)
def test_bad_config_names_the_key(data: dict[str, Any], words: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, "policy.yaml")
    message = str(caught.value)
    assert message.startswith("policy.yaml: invalid policy config: ")
    for word in words:
        assert word in message


@pytest.mark.parametrize(("data", "words"), BAD)
def test_bad_config_from_a_file_names_file_and_key(tmp_path: Path, data: Any, words: tuple[str, ...]) -> None:
    # the same documents read from disk: the error names the file path and the key
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: invalid policy config: ")
    assert words[0] in str(caught.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        # a YAML list at the top
        pytest.param("- a\n- b\n", ("must be a mapping", "list"), id="list-document"),
        # a bare string
        pytest.param("hello\n", ("must be a mapping", "str"), id="string-document"),
        # broken YAML: unclosed flow sequence
        pytest.param("exemptNamespaces: [a, b\n", ("not valid YAML",), id="invalid-yaml"),
        # tab indentation
        pytest.param("mps:\n\tinjectHostIPC: false\n", ("not valid YAML",), id="tab-indent"),
    ],
)
def test_unreadable_documents(tmp_path: Path, text: str, words: tuple[str, ...]) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: ")
    for word in words:
        assert word in str(caught.value)


def test_missing_file(tmp_path: Path) -> None:
    # a path that does not exist: named, with the OS reason
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read policy config: No such file or directory"):
        load_config(path)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    # the ConfigMap mounted as a directory and the path pointing at it
    with pytest.raises(ConfigError, match="cannot read policy config"):
        load_config(tmp_path)


def test_device_plugin_extra_fields_are_kept() -> None:
    # upstream device plugin fields we do not type (resources, flags.failOnInitError...) are accepted
    config = parse_config({"sharing": {"configs": {"default": {
        "version": "v1",
        "flags": {"migStrategy": "none", "failOnInitError": True, "plugin": {"deviceListStrategy": "envvar"}},
        "resources": {"gpus": [{"pattern": "*", "name": "gpu"}]},
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4, "devices": "all"}]}}}}}})
    assert config.sharing.configs["default"].sharing.time_slicing is not None


def test_config_is_immutable() -> None:
    # the policy is compiled once; a frozen model prevents accidental edits per request
    config = PolicyConfig()
    with pytest.raises(Exception, match="frozen"):
        config.exempt_namespaces = ()  # type: ignore[misc]


@pytest.mark.parametrize("rule_id", sorted(RULE_IDS))
def test_every_rule_can_be_disabled(rule_id: str) -> None:
    # each known ID is accepted in rules.disabled, and the policy built from it leaves that rule out
    config = parse_config({"rules": {"disabled": [rule_id]}})
    assert config.rules.disabled == (rule_id,)
    assert [r.id for r in Policy(config).rules] == sorted(RULE_IDS - {rule_id}, key=[r.id for r in RULES].index)


@pytest.mark.parametrize("rule_id", ["GPU099", "gpu001"])
def test_an_unknown_rule_id_stops_the_policy_naming_the_key(rule_id: str) -> None:
    # GPU099 does not exist and lowercase IDs are not silently ignored. The IDs are checked where
    # config and rules meet, when the Policy is built (the rules import config.py's types).
    config = parse_config({"rules": {"disabled": [rule_id]}})
    with pytest.raises(ConfigError) as caught:
        Policy(config)
    message = str(caught.value)
    assert message.startswith(f"invalid policy config: rules.disabled: unknown rule IDs ['{rule_id}']; known: ")
    assert all(known in message for known in RULE_IDS)
