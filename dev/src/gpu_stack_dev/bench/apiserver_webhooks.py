"""Where the release's webhook configurations point during bench/apiserver_load.py (ours, the bare allow-all,
none) and their matchConditions, each change checked with a probe before it is measured."""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
import uuid
from typing import Any

from gpu_stack_dev import chartlib
from gpu_stack_dev.bench import apiserver_calls as calls_
from gpu_stack_dev.bench.apiserver_rounds import BARE, BARE_ANSWERS, OURS
from gpu_stack_dev.e2e import apiload, e2elib

OPT_OUT = "gpu-stack.io/webhook"

HOOKS = ("mutate.gpu-stack.io", "validate.gpu-stack.io")

CONFIG_SETTLE = 3.0  # seconds after patching matchConditions before counting (set_conditions)

EXPECT = {BARE: "admitted", BARE_ANSWERS: "warned", OURS: "denied"}  # how each answers point_at's probe

# --- the webhooks ---------------------------------------------------------------------------------
def admission_review(namespace: str) -> dict[str, Any]:
    """The review the API server sends for the bench pod (requests defaulted from limits)."""
    pod = apiload.pod_body()
    pod["metadata"]["namespace"] = namespace
    for container in pod["spec"]["containers"]:
        container["resources"]["requests"] = dict(container["resources"]["limits"])
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": namespace,
        "operation": "CREATE", "userInfo": {"username": f"system:serviceaccount:{namespace}:{apiload.LOADER}"},
        "object": pod, "oldObject": None, "dryRun": False}}

def our_mutate_answer(hook: e2elib.LiveWebhook, namespace: str) -> dict[str, Any]:
    """What our /mutate answers for the bench pod, minus uid and allowed."""
    assert hook.pki is not None
    context = ssl.create_default_context(cafile=str(hook.pki.ca_cert))
    request = urllib.request.Request(f"https://127.0.0.1:{hook.port}/mutate", method="POST",
                                     data=json.dumps(admission_review(namespace)).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=context, timeout=10) as reply:  # noqa: S310 (loopback)
        response = json.load(reply)["response"]
    return {k: v for k, v in response.items() if k not in ("uid", "allowed")}

def point_at(cluster: e2elib.E2ECluster, hook: e2elib.LiveWebhook, release: e2elib.Release, namespace: str,
             expect: str) -> None:
    """Re-point the configurations at `hook` and wait until the API server calls it: a dry-run pod that
    ours denies ("denied"), the answering allow-all admits with its warning ("warned"), the bare
    allow-all admits without one ("admitted")."""
    apiload.repoint(cluster, hook, release)
    # A GPU pod: the webhook configurations' matchConditions send only what a rule can act on.
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bench-probe"},
             "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": 1}},
                                      "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}
    deadline = time.monotonic() + 60
    while True:
        proc = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(probe),
                               check=False)
        seen = ("denied" if "denied the request" in proc.stderr else "warned" if "Warning:" in proc.stderr
                else "admitted" if proc.returncode == 0 else proc.stderr)
        if seen == expect:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the API server did not switch to {expect!r}: {seen}")
        time.sleep(0.3)

# --- webhook calls per 1,000 mixed creates, non-GPU latency with the webhook on and off -------
def webhook_configurations(cluster: e2elib.E2ECluster, release: e2elib.Release) -> list[dict[str, Any]]:
    return [obj for kind in e2elib.WEBHOOK_KINDS for obj in cluster.get_json(kind, "-l", release.selector)["items"]]

def declared_configurations(rendered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rendered` with the matchConditions the chart renders with `webhook.policy.nonGpuRuntimeClassNames`
    naming the bench's sandboxes (calls_.DECLARED)."""
    values = {"webhook.policy.nonGpuRuntimeClassNames": sorted(calls_.SANDBOXES)}
    conditions = {hook["name"]: hook["matchConditions"] for obj in chartlib.render(4, "default", values).objects()
                  if obj["kind"].endswith("WebhookConfiguration") for hook in obj["webhooks"]}
    return [{**obj, "webhooks": [{**hook, "matchConditions": conditions[hook["name"]]} for hook in obj["webhooks"]]}
            for obj in rendered]

def patch_conditions(cluster: e2elib.E2ECluster, release: e2elib.Release, rendered: list[dict[str, Any]],
                     state: str) -> None:
    """Every configuration of the release with the matchConditions of `state`: AFTER, ON or DECLARED, those of
    `rendered`; BEFORE, none; FLOOR, the constant `false`."""
    # By kind and name: the chart names its mutating and validating configurations alike.
    by_name = {(obj["kind"], obj["metadata"]["name"]): obj for obj in rendered}
    for obj in webhook_configurations(cluster, release):
        patch = (calls_.without_conditions(obj) if state == calls_.BEFORE
                 else calls_.floor_conditions(obj) if state == calls_.FLOOR
                 else calls_.with_conditions(obj, by_name[obj["kind"], obj["metadata"]["name"]]))
        if patch:
            cluster.kubectl("patch", obj["kind"].lower(), obj["metadata"]["name"], "--type=json",
                            "-p", json.dumps(patch))

def set_conditions(cluster: e2elib.E2ECluster, release: e2elib.Release, rendered: list[dict[str, Any]],
                   keep: bool) -> None:
    """The release's configurations with the matchConditions the chart rendered (keep) or none at all."""
    patch_conditions(cluster, release, rendered, calls_.AFTER if keep else calls_.BEFORE)
    time.sleep(CONFIG_SETTLE)  # the API server's informer sees the change within this (see the notes)

def set_webhook(cluster: e2elib.E2ECluster, release: e2elib.Release, saved: list[dict[str, Any]], namespace: str,
                state: str) -> None:
    """No webhook configurations at all (OFF); the saved ones (ON, or DECLARED with declared_configurations;
    created again when deleted); or those with every matchCondition the constant `false` (FLOOR). Then wait
    until the API server acts on it: a dry-run GPU pod setting NVIDIA_VISIBLE_DEVICES is denied only when ON
    or DECLARED."""
    if state == calls_.FLOOR:
        # From ON (the API server has seen the configurations), so that an admitted probe below means the
        # `false` conditions are in effect rather than configurations not seen yet.
        set_webhook(cluster, release, saved, namespace, calls_.ON)
    current = webhook_configurations(cluster, release)
    if state == calls_.OFF:
        for obj in current:
            cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"])
    elif not current:
        keep = ("name", "labels", "annotations")
        fresh = [{**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k in keep}} for obj in saved]
        cluster.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": fresh}))
    if state != calls_.OFF:
        patch_conditions(cluster, release, saved, state)
    probe = apiload.pod_body()
    probe["metadata"] = {"name": "bench-switch-probe"}
    probe["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    deadline = time.monotonic() + 60
    while True:
        proc = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(probe),
                               check=False)
        if ("denied the request" in proc.stderr) if state in (calls_.ON, calls_.DECLARED) else proc.returncode == 0:
            if state != calls_.OFF:
                # FLOOR: admitted from the first patched configuration, so wait for the second; ON and DECLARED
                # deny the probe alike, so the probe cannot tell one from the other.
                time.sleep(CONFIG_SETTLE)
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the API server did not switch the webhook to {state}: {proc.stderr}")
        time.sleep(0.3)
