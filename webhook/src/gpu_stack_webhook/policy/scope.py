"""Which of the rules' signals (policy/signals.py Signal) a request carries: the Python twin of the webhook
configurations' matchConditions (cel/match_conditions.py), compared with them on generated pods.

Not on the review path: the rules gate themselves (each returns nothing outside its SCOPE, which
tests/property/test_match_conditions.py checks); this module answers "would the API server call the
webhook" for tests, `check` and the docs.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpu_stack_webhook.policy.context import Context
from gpu_stack_webhook.policy.dra import names_dra
from gpu_stack_webhook.policy.gpus import is_gpu_pod
from gpu_stack_webhook.policy.pod import PodView
from gpu_stack_webhook.policy.rules import RULES, Rule
from gpu_stack_webhook.policy.rules.device_bypass import CDI_ANNOTATION_PREFIX, DEVICE_LIST_NAME
from gpu_stack_webhook.policy.rules.mps import mps_selection
from gpu_stack_webhook.policy.rules.visible_devices import VARIABLE
from gpu_stack_webhook.policy.signals import Signal, reaches_nvidia_runtime


def signals(pod: PodView, ctx: Context) -> frozenset[Signal]:
    """Every signal the pod (or workload's pod template) carries."""
    found = set()
    gpu_pod = is_gpu_pod(pod, ctx) or names_dra(pod)
    if gpu_pod:
        found.add(Signal.GPU_POD)
    if gpu_pod or (reaches_nvidia_runtime(pod, ctx) and reads_runtime_input(pod)):
        found.add(Signal.NVIDIA_RUNTIME)
    if mps_selection(pod, ctx) is not None:
        found.add(Signal.MPS_SELECTION)
    if any(isinstance(key, str) and key.startswith(CDI_ANNOTATION_PREFIX) for key in pod.annotations):
        found.add(Signal.CDI_ANNOTATION)
    return frozenset(found)


def reads_runtime_input(pod: PodView) -> bool:
    """Does a container name what the NVIDIA runtime reads from a pod spec (GPU002, GPU007's mounts):
    NVIDIA_VISIBLE_DEVICES in env, any envFrom source, a mount path with the device list directory's name?"""
    for container in pod.containers():
        if container.env_from or any(isinstance(e, dict) and e.get("name") == VARIABLE for e in container.env):
            return True
        for mount in container.spec.get("volumeMounts") or []:
            path = mount.get("mountPath") if isinstance(mount, dict) else None
            if isinstance(path, str) and DEVICE_LIST_NAME in path:
                return True
    return False


def object_in_scope(kind: str, ctx: Context) -> bool:
    """Would a rule act on a ResourceClaim or ResourceClaimTemplate (Signal.DRA_OBJECT)?"""
    if kind not in ("ResourceClaim", "ResourceClaimTemplate"):
        return False
    return any(Signal.DRA_OBJECT in rule.scope for rule in judging_rules(RULES, ctx))


def judging_rules(rules: Iterable[Rule], ctx: Context) -> tuple[Rule, ...]:
    """The rules a webhook runs: every rule not in the config's rules.disabled."""
    disabled = set(ctx.config.rules.disabled)
    return tuple(rule for rule in rules if rule.id not in disabled)


def in_scope(pod: PodView, ctx: Context, *, mutating: bool) -> bool:
    """Would a rule of this webhook (/mutate: the mutating rules; /validate: all) act on the pod?"""
    rules = judging_rules((r for r in RULES if r.mutating or not mutating), ctx)
    carried = signals(pod, ctx)
    return any(carried.intersection(rule.scope) for rule in rules)
