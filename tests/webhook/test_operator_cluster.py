"""Beside the GPU Operator: every NVIDIA runtime class by its handler, every device-injection path, and the
operator's own pods admitted as its own (docs/gpu-operator.md).

Upstream facts pinned here:
- gpu-operator v26.7.0 controllers/object_controls.go: RuntimeClasses `nvidia`, `nvidia-cdi`, `nvidia-legacy`
  (RuntimeClasses(); the last two only with CDI on); getRuntimeClassName / CONTAINERD_RUNTIME_CLASS: the
  toolkit's handler is named after `operator.runtimeClass`; setNRIPluginAnnotation: in NRI mode
  `nvidia.cdi.k8s.io/container.<name>: management.nvidia.com/gpu=all`; TransformDevicePlugin: `devicePlugin.args`
  become the plugin container's args.
- nvidia-container-toolkit v1.20.0 cmd/nvidia-ctk-installer/container/operator/operator.go GetRuntimes: handlers
  `<name>`, `nvidia-cdi`, `nvidia-legacy`; container/runtime/nri/plugin.go: the NRI plugin injects what
  `nvidia.cdi.k8s.io/container.<name>`, `/pod` or the bare domain names (GetEffectiveAnnotation), and
  `management.nvidia.com/gpu` only in its allowed namespaces (any other CDI device in every namespace).
- k8s-device-plugin v0.20.0 cmd/nvidia-device-plugin/main.go: flags `--mig-strategy` (MIG_STRATEGY),
  `--device-list-strategy` (DEVICE_LIST_STRATEGY), `--config-file` (CONFIG_FILE); urfave/cli reads EnvVars only
  for a flag the command line does not set.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from gpu_stack_webhook.admission import decide
from gpu_stack_webhook.admission.decide import Decision, Endpoint
from gpu_stack_webhook.admission.review import parse_review
from gpu_stack_webhook.kube.client import Forbidden
from gpu_stack_webhook.kube.live import OperatorReader, RuntimeClassReader
from gpu_stack_webhook.kube.lookups import ApiFacts, OwnerFacts
from gpu_stack_webhook.policy.config import PolicyConfig, RuntimeClasses
from gpu_stack_webhook.policy.engine import Policy
from gpu_stack_webhook.policy.facts import OFFLINE, ClusterFacts
from gpu_stack_webhook.policy.live import operator_policy, read_cluster_policy
from gpu_stack_webhook.policy.plugin_inputs import SourceError

from .kube_fake import FakeKube
from .podlib import container, make_pod, review, wrap
from .test_live_source import cluster_policy

OPERATOR_NS = "nvidia-gpu"
DS_CONTROLLER = "system:serviceaccount:kube-system:daemon-set-controller"
OPERATOR_SA = f"system:serviceaccount:{OPERATOR_NS}:gpu-operator"
USER = "kubernetes-admin"
VISIBLE = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
POLICY_UID = "4d9c2a43-cp"
DS_UID = "0b1f-ds"


def read_operator(change: Any = None) -> PolicyConfig:
    """The webhook's policy from the default ClusterPolicy changed by `change`, as kube/live.py reads it."""
    obj = copy.deepcopy(cluster_policy())
    obj["metadata"]["uid"] = POLICY_UID
    obj["status"] = {"namespace": OPERATOR_NS}
    if change is not None:
        change(obj)
    fake = FakeKube()
    fake.cluster_policies["cluster-policy"] = obj
    return OperatorReader(fake, "cluster-policy", "gpu-operator")(PolicyConfig())


def operator_config(change: Any = None, **updates: Any) -> PolicyConfig:
    config = read_operator(change)
    assert not config.source_error, config.source_error
    return config.model_copy(update=updates)


def judge(config: PolicyConfig, obj: dict[str, Any], *, username: str = USER, namespace: str = "gpu-demo",
          facts: ClusterFacts = OFFLINE) -> Decision:
    body = review(obj, namespace=namespace)
    body["request"]["userInfo"] = {"username": username}
    return decide.review(Policy(config, facts=facts), parse_review(body), Endpoint.VALIDATE)


def rules_of(decision: Decision) -> set[str]:
    return set(decision.denied_by)


# --- the runtime by its handler, not its name -----------------------------------------------------------


def with_handlers(config: PolicyConfig, **handlers: str) -> PolicyConfig:
    return config.model_copy(update={"runtime_classes": RuntimeClasses(handlers=handlers)})


@pytest.mark.parametrize("runtime_class", ["nvidia", "nvidia-cdi", "nvidia-legacy", "gpu-fast"])
def test_every_nvidia_runtime_class_is_a_gpu_runtime_class(runtime_class: str) -> None:
    config = with_handlers(operator_config(), **{"nvidia": "nvidia", "nvidia-cdi": "nvidia-cdi",
                                                 "nvidia-legacy": "nvidia-legacy", "gpu-fast": "nvidia"})
    cuda_image = make_pod([container("main")], runtimeClassName=runtime_class)
    assert rules_of(judge(config, cuda_image)) == {"GPU011"}
    leak = make_pod([container("main", env=[VISIBLE])], runtimeClassName=runtime_class)
    assert rules_of(judge(config, leak)) == {"GPU002", "GPU011"}
    assert judge(config, make_pod([container("main", gpu=1)], runtimeClassName=runtime_class)).allowed


def test_other_runtimes_and_plain_pods_are_left_alone() -> None:
    config = with_handlers(operator_config(), kata="kata-qemu", nvidia="nvidia")
    assert judge(config, make_pod([container("main", env=[VISIBLE])], runtimeClassName="kata")).allowed
    assert judge(config, make_pod([container("main", env=[VISIBLE])])).allowed


def test_the_operators_custom_runtime_class_is_its_handler() -> None:
    config = operator_config(lambda o: o["spec"]["operator"].update({"runtimeClass": "nvidia-gpu"}))
    assert "nvidia-gpu" in config.nvidia_runtime_handlers
    config = with_handlers(config, **{"nvidia-gpu": "nvidia-gpu", "fast": "nvidia-gpu"})
    assert rules_of(judge(config, make_pod([container("main")], runtimeClassName="fast"))) == {"GPU011"}


def test_runtime_classes_that_cannot_be_read_deny_only_pods_naming_one() -> None:
    fake = FakeKube()
    fake.fail_next["list_runtime_classes"] = [Forbidden(403, "Forbidden", "runtimeclasses is forbidden")]
    config = RuntimeClassReader(fake)(PolicyConfig(nvidiaRuntimeIsDefault=False))
    assert config.runtime_classes is not None and "runtimeclasses is forbidden" in config.runtime_classes.error
    denied = judge(config, make_pod([container("main")], runtimeClassName="kata"))
    assert rules_of(denied) == {"GPU010"}
    assert "runtime class kata may be the NVIDIA runtime, which cannot be known: RuntimeClasses cannot be " \
           "read: no permission to list runtimeclasses.node.k8s.io" in denied.message
    assert judge(config, make_pod([container("main", env=[VISIBLE])])).allowed  # plain pods: never refused


def test_a_runtime_class_created_since_the_last_read_is_looked_up() -> None:
    fake = FakeKube()
    fake.runtime_classes = {"kata": "kata-qemu"}
    config = RuntimeClassReader(fake)(operator_config())
    fake.runtime_classes["gpu-new"] = "nvidia-legacy"
    pod = make_pod([container("main")], runtimeClassName="gpu-new")
    assert rules_of(judge(config, pod, facts=ApiFacts(fake))) == {"GPU011"}
    # without lookups it cannot be known: denied, naming why
    assert "RuntimeClass gpu-new is not among those the webhook has read" in judge(config, pod).message
    # a template naming no RuntimeClass at all: its pods are refused by the API server's RuntimeClass admission
    ghost = wrap(make_pod([container("main")], runtimeClassName="ghost"), "Deployment")
    assert judge(config, ghost, facts=ApiFacts(fake)).allowed


def test_the_reader_lists_runtime_classes_after_the_policy_source() -> None:
    fake = FakeKube()
    fake.cluster_policies["cluster-policy"] = cluster_policy()
    fake.runtime_classes = {"nvidia": "nvidia", "runsc": "runsc"}
    config = RuntimeClassReader(fake, OperatorReader(fake, "cluster-policy", "gpu-operator"))(PolicyConfig())
    assert config.runtime_classes == RuntimeClasses(handlers={"nvidia": "nvidia", "runsc": "runsc"})
    assert config.envvar_when_unprivileged is True  # the operator's part was read too


# --- every device-injection path ------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["nvidia.cdi.k8s.io/container.main", "nvidia.cdi.k8s.io/pod", "nvidia.cdi.k8s.io"])
@pytest.mark.parametrize("nri", [None, False, True])
def test_nri_annotations_are_denied_whatever_the_cluster_policy_says(key: str, nri: bool | None) -> None:
    pod = make_pod([container("main")], annotations={key: "nvidia.com/gpu=all"})
    if nri is None:
        config = PolicyConfig()  # the chart's own mode, CEL mode: whether NRI runs is not known
    else:
        config = operator_config(lambda o: o["spec"]["cdi"].update({"nriPluginEnabled": nri}))
        assert config.nri_plugin_enabled is nri
    denied = judge(config, pod)
    assert rules_of(denied) == {"GPU007"} and f'annotation "{key}" requests CDI devices directly' in denied.message


@pytest.mark.parametrize(("cdi", "env", "nri"), [
    ({"nriPluginEnabled": True}, [], True),
    ({}, [{"name": "ENABLE_NRI_PLUGIN", "value": "true"}], True),  # toolkit.env alone turns it on
    ({"nriPluginEnabled": True}, [{"name": "ENABLE_NRI_PLUGIN", "value": "false"}], False),  # applied after
    ({"enabled": False, "nriPluginEnabled": True}, [], False),  # transformToolkitCtrForCDI runs only with CDI
])
def test_the_nri_plugin_is_read_from_the_cluster_policy_and_toolkit_env(cdi: dict[str, Any], env: list[Any],
                                                                        nri: bool) -> None:
    def edit(obj: dict[str, Any]) -> None:
        obj["spec"]["cdi"].update(cdi)
        obj["spec"]["toolkit"]["env"] = env

    assert operator_config(edit).nri_plugin_enabled is nri


@pytest.mark.parametrize("name", ["gpu", "nvidia-cdi"])
def test_toolkit_env_nvidia_runtime_name_is_a_handler(name: str) -> None:
    config = operator_config(lambda o: o["spec"]["toolkit"].update(
        {"env": [{"name": "NVIDIA_RUNTIME_NAME", "value": name}]}))
    assert name in config.nvidia_runtime_handlers
    config = config.model_copy(update={"runtime_classes": RuntimeClasses(handlers={"fast": name, "gvisor": "runsc"})})
    env_pod = make_pod([container("main", env=[VISIBLE])], runtimeClassName="fast")
    assert "GPU002" in rules_of(judge(config, env_pod))
    assert judge(config, make_pod([container("main", env=[VISIBLE])],
                                  runtimeClassName="gvisor")).allowed


@pytest.mark.parametrize(("env", "message"), [
    ({"name": "ENABLE_NRI_PLUGIN", "value": "maybe"},
     "spec.toolkit.env ENABLE_NRI_PLUGIN='maybe' is not a boolean the toolkit reads"),
    ({"name": "NVIDIA_RUNTIME_SET_AS_DEFAULT", "value": "yes"},
     "spec.toolkit.env NVIDIA_RUNTIME_SET_AS_DEFAULT='yes' is not a boolean the toolkit reads"),
    ({"name": "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED", "value": True},
     "spec.toolkit.env[0] (ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED) value is not a string: True"),
    ({"name": "NVIDIA_RUNTIME_NAME", "value": "Not A Handler"},
     "spec.toolkit.env NVIDIA_RUNTIME_NAME='Not A Handler' is not a runtime handler name"),
])
def test_an_unknown_toolkit_env_value_fails_closed_for_gpu_pods_only(env: dict[str, Any], message: str) -> None:
    config = read_operator(lambda o: o["spec"]["toolkit"].update({"env": [env]}))
    assert message in config.source_error
    assert rules_of(judge(config, make_pod([container("main", gpu=1)]))) == {"GPU010"}
    assert judge(config, make_pod([container("main")])).allowed


@pytest.mark.parametrize(("args", "mig", "strategies"), [
    (["--mig-strategy=mixed"], "mixed", ("cdi-annotations", "cdi-cri")),
    (["--mig-strategy", "none", "--device-list-strategy=envvar"], "none", ("envvar",)),
    (["-device-list-strategy", "volume-mounts", "--device-list-strategy=envvar"], "single",
     ("volume-mounts", "envvar")),
    (["--fail-on-init-error=false"], "single", ("cdi-annotations", "cdi-cri")),
])
def test_device_plugin_args_outrank_its_environment(args: list[str], mig: str, strategies: tuple[str, ...]) -> None:
    obj = cluster_policy()
    obj["spec"]["devicePlugin"]["env"] = [{"name": "MIG_STRATEGY", "value": "single"}]
    obj["spec"]["devicePlugin"]["args"] = args
    settings = read_cluster_policy(obj)
    assert (settings.mig_strategy, settings.device_list_strategy) == (mig, strategies)


def test_device_plugin_args_the_policy_cannot_follow_are_refused() -> None:
    obj = cluster_policy()
    obj["spec"]["devicePlugin"]["args"] = ["--config-file=/etc/other.yaml"]
    with pytest.raises(SourceError, match="sets --config-file: the device plugin would then read a config"):
        read_cluster_policy(obj)
    obj["spec"]["devicePlugin"]["args"] = ["--mig-strategy"]
    with pytest.raises(SourceError, match="--mig-strategy has no value"):
        read_cluster_policy(obj)


def test_args_reach_the_verdicts() -> None:
    obj = cluster_policy()
    obj["spec"]["devicePlugin"]["args"] = ["--mig-strategy=mixed"]
    config = operator_policy(PolicyConfig(), read_cluster_policy(obj), None)
    mig = make_pod([container("main", requests={"nvidia.com/mig-1g.5gb": 1}, limits={"nvidia.com/mig-1g.5gb": 1})])
    assert judge(config, mig).allowed  # under `single` (the default ClusterPolicy) GPU005 denies it


# --- the operator's own pods ----------------------------------------------------------------------------


def operand_daemonset(runtime_class: str | None = "nvidia", annotations: dict[str, str] | None = None,
                      owner: str = "cluster-policy", owner_uid: str = POLICY_UID) -> dict[str, Any]:
    """An operand DaemonSet as the operator writes it (gpu-operator v26.7.0 assets/state-device-plugin)."""
    spec_fields = {"runtimeClassName": runtime_class} if runtime_class else {}
    pod = make_pod([container("nvidia-device-plugin", privileged=True)], init=[container("toolkit-validation",
                   privileged=True)], namespace=OPERATOR_NS, annotations=annotations, **spec_fields)
    ds = wrap(pod, "DaemonSet")
    ds["metadata"] = {"name": "nvidia-device-plugin-daemonset", "namespace": OPERATOR_NS, "uid": DS_UID,
                      "ownerReferences": [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": owner,
                                           "uid": owner_uid, "controller": True, "blockOwnerDeletion": True}]}
    return ds


def operand_pod(ds: dict[str, Any], uid: str = DS_UID) -> dict[str, Any]:
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "spec": copy.deepcopy(ds["spec"]["template"]["spec"]),
                           "metadata": {**copy.deepcopy(ds["spec"]["template"]["metadata"]),
                                        "generateName": "nvidia-device-plugin-daemonset-", "namespace": OPERATOR_NS,
                                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                                             "name": ds["metadata"]["name"], "uid": uid,
                                                             "controller": True}]}}
    return pod


def operator_facts(ds: dict[str, Any]) -> OwnerFacts:
    fake = FakeKube()
    fake.daemonsets[(OPERATOR_NS, ds["metadata"]["name"])] = ds["metadata"]
    return OwnerFacts(fake)


@pytest.mark.parametrize("nri", [False, True])
def test_the_operators_daemonsets_and_their_pods_are_admitted_as_its_own(nri: bool) -> None:
    config = operator_config(lambda o: o["spec"]["cdi"].update({"nriPluginEnabled": nri}))
    ds = (operand_daemonset(None, {"nvidia.cdi.k8s.io/container.nvidia-device-plugin": "management.nvidia.com/gpu=all"})
          if nri else operand_daemonset())
    assert not judge(config, ds, username=USER, namespace=OPERATOR_NS).allowed  # the same object from a user
    written = judge(config, ds, username=OPERATOR_SA, namespace=OPERATOR_NS)
    assert written.allowed and written.skipped.startswith("the GPU Operator's own: written by the GPU Operator")
    facts = operator_facts(ds)
    created = judge(config, operand_pod(ds), username=DS_CONTROLLER, namespace=OPERATOR_NS, facts=facts)
    assert created.allowed
    assert created.skipped == ("the GPU Operator's own: a pod of DaemonSet nvidia-device-plugin-daemonset, which "
                               "ClusterPolicy cluster-policy controls")


def test_a_user_pod_in_the_operators_namespace_is_still_judged() -> None:
    config = operator_config()
    ds = operand_daemonset()
    facts = operator_facts(ds)
    pod = operand_pod(ds)
    # the same pod, sent by a user (claiming the DaemonSet as its owner), not by the DaemonSet controller
    assert rules_of(judge(config, pod, username=USER, namespace=OPERATOR_NS, facts=facts)) >= {"GPU003"}
    # another DaemonSet of that name, since re-created: the pod names the old uid
    assert not judge(config, operand_pod(ds, uid="stale"), username=DS_CONTROLLER, namespace=OPERATOR_NS,
                     facts=facts).allowed
    # a DaemonSet controlled by something else than the ClusterPolicy
    other = operand_daemonset(owner="someone-else")
    assert not judge(config, operand_pod(other), username=DS_CONTROLLER, namespace=OPERATOR_NS,
                     facts=operator_facts(other)).allowed
    assert not judge(config, other, username=OPERATOR_SA, namespace=OPERATOR_NS).allowed
    # outside the operator's namespace nothing is the operator's
    assert not judge(config, ds, username=OPERATOR_SA, namespace="gpu-demo").allowed
    # without a lookup of the DaemonSet the pod cannot be told apart: judged
    assert not judge(config, pod, username=DS_CONTROLLER, namespace=OPERATOR_NS).allowed


def test_who_the_operator_is_is_known_before_its_cluster_policy() -> None:
    fake = FakeKube()
    config = OperatorReader(fake, "cluster-policy", "gpu-operator", "gpu-operator")(PolicyConfig())
    assert "ClusterPolicy cluster-policy does not exist" in config.source_error
    assert config.gpu_operator is not None
    assert (config.gpu_operator.namespace, config.gpu_operator.cluster_policy_uid) == ("gpu-operator", "")
    # the operator's first DaemonSet after `kubectl apply` of its ClusterPolicy is not refused meanwhile
    ds = operand_daemonset()
    ds["metadata"]["namespace"] = "gpu-operator"
    first = judge(config, ds, username="system:serviceaccount:gpu-operator:gpu-operator", namespace="gpu-operator")
    assert first.allowed
    # once read: its uid and status.namespace
    assert operator_config().gpu_operator.model_dump() == {  # type: ignore[union-attr]
        "namespace": OPERATOR_NS, "service_account": "gpu-operator", "cluster_policy": "cluster-policy",
        "cluster_policy_uid": POLICY_UID}


# --- the validator's own workload pods (gpu-operator v26.7.0 cmd/nvidia-validator/main.go runWorkload) ---------

VALIDATOR_SA = f"system:serviceaccount:{OPERATOR_NS}:nvidia-operator-validator"
VALIDATOR_DS_UID = "7e2a-validator-ds"


def validator_daemonset(owner_uid: str = POLICY_UID) -> dict[str, Any]:
    ds = operand_daemonset(owner_uid=owner_uid)
    ds["metadata"]["name"], ds["metadata"]["uid"] = "nvidia-operator-validator", VALIDATOR_DS_UID
    return ds


def cuda_validation_pod(ds: dict[str, Any], runtime_class: str | None = "nvidia") -> dict[str, Any]:
    """validator/manifests/cuda-workload-validation.yaml as CUDA.runWorkload fills it: the DaemonSet's owner
    references (main.go:1600), its namespace, the node, and the runtime class of VALIDATOR_RUNTIME_CLASS."""
    spec_fields = {"runtimeClassName": runtime_class} if runtime_class else {}
    pod = make_pod([container("nvidia-cuda-validator", privileged=True)],
                   init=[container("cuda-validation", privileged=True, env=[VISIBLE])], namespace=OPERATOR_NS,
                   annotations={"nvidia.cdi.k8s.io/container.cuda-validation": "management.nvidia.com/gpu=all"},
                   nodeName="gpu-node-1", **spec_fields)
    pod["metadata"]["generateName"] = "nvidia-cuda-validator-"
    pod["metadata"]["ownerReferences"] = copy.deepcopy(ds["metadata"]["ownerReferences"])
    return pod


@pytest.mark.parametrize("nri", [False, True])
def test_the_validators_workload_pod_is_admitted_for_who_sends_it_and_what_owns_it(nri: bool) -> None:
    config = operator_config(lambda o: o["spec"]["cdi"].update({"nriPluginEnabled": nri}))
    ds = validator_daemonset()
    facts = operator_facts(ds)
    pod = cuda_validation_pod(ds, None if nri else "nvidia")
    sent = judge(config, pod, username=VALIDATOR_SA, namespace=OPERATOR_NS, facts=facts)
    assert sent.allowed and sent.skipped == (
        "the GPU Operator's own: a validation pod of the GPU Operator's validator, owned as DaemonSet "
        "nvidia-operator-validator is, which ClusterPolicy cluster-policy controls")
    # the same pod from anyone else, in the operator's namespace or any other, is judged (and refused)
    for username, namespace in ((USER, OPERATOR_NS), (OPERATOR_SA, OPERATOR_NS), (DS_CONTROLLER, OPERATOR_NS),
                                (VALIDATOR_SA, "gpu-demo"), (USER, "gpu-demo")):
        copied = judge(config, pod, username=username, namespace=namespace, facts=facts)
        # NRI mode: no runtime class, so the management annotation is what reaches a GPU (GPU007)
        assert not copied.allowed and rules_of(copied) >= ({"GPU007"} if nri else {"GPU002", "GPU003"}), \
            (username, namespace)


def test_the_validators_pod_with_forged_owners_is_refused() -> None:
    config = operator_config()
    ds = validator_daemonset()
    facts = operator_facts(ds)
    wrong_uid = cuda_validation_pod(ds)
    wrong_uid["metadata"]["ownerReferences"][0]["uid"] = "forged"
    denied = judge(config, wrong_uid, username=VALIDATOR_SA, namespace=OPERATOR_NS, facts=facts)
    assert not denied.allowed and "passes as the GPU Operator's (its controller is ClusterPolicy cluster-policy)" \
        in denied.message
    # owned by a DaemonSet, even one the ClusterPolicy controls: not what the validator copies
    for owner in (ds, operand_daemonset(owner="someone-else")):
        by_daemonset = cuda_validation_pod(ds)
        by_daemonset["metadata"]["ownerReferences"] = [{
            "apiVersion": "apps/v1", "kind": "DaemonSet", "controller": True, "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"]}]
        assert not judge(config, by_daemonset, username=VALIDATOR_SA, namespace=OPERATOR_NS, facts=facts).allowed
    # the validator's DaemonSet not controlled by the ClusterPolicy: nothing to copy from
    rogue = validator_daemonset(owner_uid="other-policy")
    assert not judge(config, cuda_validation_pod(rogue), username=VALIDATOR_SA, namespace=OPERATOR_NS,
                     facts=operator_facts(rogue)).allowed
    # without a lookup: cannot be told apart, judged
    assert not judge(config, cuda_validation_pod(ds), username=VALIDATOR_SA, namespace=OPERATOR_NS).allowed


# --- the operator's objects cannot be borrowed ------------------------------------------------------------


def update(config: PolicyConfig, old: dict[str, Any], new: dict[str, Any], *, username: str,
           facts: ClusterFacts = OFFLINE) -> Decision:
    body = review(new, namespace=OPERATOR_NS, operation="UPDATE", old=old)
    body["request"]["userInfo"] = {"username": username}
    return decide.review(Policy(config, facts=facts), parse_review(body), Endpoint.VALIDATE)


def test_a_users_daemonset_claiming_the_cluster_policy_is_refused_even_when_harmless() -> None:
    config = operator_config()
    harmless = operand_daemonset()
    harmless["spec"]["template"]["spec"] = make_pod([container("main")])["spec"]
    denied = judge(config, harmless, username=USER, namespace=OPERATOR_NS)
    assert not denied.allowed and denied.denied_by == ()
    assert denied.message == (
        "gpu-stack: DaemonSet nvidia-gpu/nvidia-device-plugin-daemonset passes as the GPU Operator's (its controller "
        "is ClusterPolicy cluster-policy); only the GPU Operator's ServiceAccount "
        "system:serviceaccount:nvidia-gpu:gpu-operator, in namespace nvidia-gpu, may create it, not kubernetes-admin "
        "(docs/gpu-operator.md, \"The operator's own pods\")")
    # a forged uid claims it all the same; a privileged copy is named for its violations too
    forged = operand_daemonset(owner_uid="forged")
    denied = judge(config, forged, username=USER, namespace=OPERATOR_NS)
    assert rules_of(denied) >= {"GPU003"} and "may create it" in denied.message
    assert "; and judged as any user's: " in denied.message and "GPU policy violations: [1] " in denied.message
    # the operator writes only in its namespace: anywhere else, refused from anyone
    for username in (USER, OPERATOR_SA):
        elsewhere = judge(config, harmless, username=username, namespace="gpu-demo")
        assert not elsewhere.allowed and "in namespace nvidia-gpu, may create it" in elsewhere.message


def test_an_editor_changing_an_operator_daemonsets_template_is_refused() -> None:
    config = operator_config()
    ds = operand_daemonset()
    swapped = copy.deepcopy(ds)
    swapped["spec"]["template"]["spec"]["containers"][0]["image"] = "attacker/evil:latest"
    denied = update(config, ds, swapped, username=USER)
    assert not denied.allowed and "may change its spec, not kubernetes-admin" in denied.message
    assert rules_of(denied) >= {"GPU003"}  # judged in full: what the old template already had counts
    assert update(config, ds, swapped, username=OPERATOR_SA).allowed  # the operator reconciling it
    # metadata only (a label, the garbage collector dropping the owner): judged as any update
    labelled = copy.deepcopy(ds)
    labelled["metadata"]["labels"] = {"team": "infra"}
    assert update(config, ds, labelled, username=USER).allowed
    orphaned = copy.deepcopy(ds)
    orphaned["metadata"]["ownerReferences"] = []
    assert update(config, ds, orphaned, username="system:serviceaccount:kube-system:generic-garbage-collector").allowed
    # a user's DaemonSet made the operator's by adding the controller reference, spec unchanged
    denied = update(config, orphaned, ds, username=USER)
    assert not denied.allowed and "may make the operator its controller" in denied.message


def test_a_users_pod_claiming_an_operator_daemonset_is_refused() -> None:
    config = operator_config()
    ds = operand_daemonset()
    facts = operator_facts(ds)
    harmless = operand_pod(ds)
    harmless["spec"] = make_pod([container("main")])["spec"]
    denied = judge(config, harmless, username=USER, namespace=OPERATOR_NS, facts=facts)
    assert not denied.allowed and "its controller is DaemonSet nvidia-device-plugin-daemonset, which ClusterPolicy " \
        "cluster-policy controls); only the DaemonSet controller and the GPU Operator's validator, in namespace " \
        "nvidia-gpu, may create it" \
        in denied.message
    # a running operand pod's image swapped in place
    running = operand_pod(ds)
    swapped = copy.deepcopy(running)
    swapped["spec"]["containers"][0]["image"] = "attacker/evil:latest"
    denied = update(config, running, swapped, username=USER, facts=facts)
    assert not denied.allowed and "may change its spec" in denied.message
    labelled = copy.deepcopy(running)
    labelled["metadata"]["labels"] = {"debug": "yes"}
    assert update(config, running, labelled, username=USER, facts=facts).allowed


# --- envFrom beside the device-plugin chart, whose toolkit honours the variable ----------------------------


def test_env_from_under_the_device_plugin_chart() -> None:
    """A ConfigMap is read (lookups on) and denied when it holds the variable; a Secret cannot be read (the
    webhook has no right to), so importing one without a prefix is a warning, not a denial: denying every GPU
    pod that imports its credentials that way would refuse ordinary workloads for what only the node's toolkit
    setting (accept-nvidia-visible-devices-envvar-when-unprivileged=false) can close."""
    from gpu_stack_webhook.policy.live import device_plugin_policy  # noqa: PLC0415

    config = device_plugin_policy(PolicyConfig(), "ConfigMap nvidia/plugin-configs",
                                  {"default": "version: v1\n"})
    assert config.envvar_when_unprivileged is True
    fake = FakeKube()
    fake.configmaps[("gpu-demo", "leaky")] = frozenset({"NVIDIA_VISIBLE_DEVICES"})
    fake.configmaps[("gpu-demo", "settings")] = frozenset({"LOG_LEVEL"})
    leaky = make_pod([container("main", gpu=1, env_from=[{"configMapRef": {"name": "leaky"}}])])
    assert rules_of(judge(config, leaky, facts=ApiFacts(fake))) == {"GPU002"}
    assert judge(config, make_pod([container("main", gpu=1, env_from=[{"configMapRef": {"name": "settings"}}])]),
                 facts=ApiFacts(fake)).allowed
    secret = judge(config, make_pod([container("main", gpu=1, env_from=[{"secretRef": {"name": "token"}}])]),
                   facts=ApiFacts(fake))
    assert secret.allowed and secret.warned == ("GPU002",)
