"""The webhook's objects: policy ConfigMap, Deployment (Pod Security restricted), Service, PDB, RBAC,
webhook configurations, TLS (cert-manager or user-provided), helm test hooks, NOTES."""

from __future__ import annotations

import base64
import json
import shlex
from typing import Any

import pytest
import yaml
from gpu_stack_dev.chartlib import (
    CHART,
    FULLNAME,
    NAMESPACE,
    ROOT,
    find,
    load_schema,
    one,
    overlay_values,
    overlays,
    render,
    run_helm,
    template_args,
)
from gpu_stack_webhook.policy.config import parse_config
from gpu_stack_webhook.policy.rules import RULE_IDS

from . import pss

WEBHOOK = f"{FULLNAME}-webhook"
POLICY_CM = f"{FULLNAME}-webhook-policy"
DEVICE_PLUGIN_CM = f"{FULLNAME}-device-plugin-configs"
TLS_SECRET = f"{WEBHOOK}-tls"
CA_PEM = (
    "-----BEGIN CERTIFICATE-----\nMIIBdzCCAR2gAwIBAgIUY2hhcnQtdGVzdC1jYQ==\n-----END CERTIFICATE-----\n"
)
NO_CERT_MANAGER = {"webhook.tls.mode": "secret", "webhook.tls.caBundle": CA_PEM}
CERT_MANAGER = {"webhook.tls.mode": "cert-manager"}
SELF_MANAGED_ARGS = [
    "--tls-mode", "self-managed", "--cert-dir", "/run/gpu-stack/tls", "--tls-secret", TLS_SECRET,
    "--namespace", NAMESPACE, "--service", WEBHOOK, "--mutating-webhook-configuration", WEBHOOK,
    "--validating-webhook-configuration", WEBHOOK]
OVERLAYS = overlays()
APP_VERSION = str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])
# What the chart renders without webhook.image.repository (helm template): a name that can never be pulled
# (.invalid, RFC 2606) and says which value to set.
MARKER_IMAGE = f"set-webhook-image-repository.invalid/gpu-stack-webhook:{APP_VERSION}"


def objects(**set_json: Any) -> list[dict[str, Any]]:
    return render(3, set_json=set_json or None).objects()


def policy_of(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(one(objs, "ConfigMap", POLICY_CM)["data"]["policy.yaml"])


# ---- policy ConfigMap -------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_policy_parses_and_agrees_with_device_plugin_configmap(overlay: str) -> None:
    objs = render(3, overlay).objects()
    values = overlay_values(overlay)
    assert values["webhook"]["enabled"], f"{overlay} turns the webhook off: no policy ConfigMap to compare"
    policy = policy_of(objs)
    config = parse_config(policy, f"{overlay}: {POLICY_CM}")
    assert config.sharing.default_config == values["sharing"]["defaultConfig"]
    assert set(policy["sharing"]["configs"]) == set(values["sharing"]["configs"])

    plugin_cms = find(objs, "ConfigMap", DEVICE_PLUGIN_CM)
    if overlay.startswith("policy-only-"):  # the webhook follows another project's device plugin
        assert not plugin_cms and values["webhook"]["policySource"]["mode"] != "values"
        return
    assert plugin_cms, f"{overlay}: the device plugin ConfigMap {DEVICE_PLUGIN_CM} is not rendered"
    plugin_configs = {name: yaml.safe_load(text) for name, text in plugin_cms[0]["data"].items()}
    assert plugin_configs == policy["sharing"]["configs"], (
        f"{overlay}: webhook policy sharing.configs differ from the device plugin ConfigMap"
    )


def test_policy_content_from_values() -> None:
    objs = objects(**{
        "webhook.policy.extraExemptNamespaces": ["batch-system", "kube-system"],
        "webhook.policy.mps.injectHostIPC": False,
        "webhook.policy.rules.disabled": ["GPU005"],
        "webhook.policy.rules.migUnexposed": "warn",
        "webhook.policy.gpuRuntimeClassNames": ["nvidia", "nvidia-cdi"],
    })
    policy = policy_of(objs)
    assert policy["exemptNamespaces"] == [NAMESPACE, "kube-system", "batch-system"]
    assert policy["sharing"]["nodeConfigLabel"] == "nvidia.com/device-plugin.config"
    config = parse_config(policy)
    assert config.mps.inject_host_ipc is False
    assert config.rules.disabled == ("GPU005",)
    assert config.rules.mig_unexposed == "warn"
    assert config.gpu_runtime_class_names == ("nvidia", "nvidia-cdi")


def test_default_policy_equals_webhook_defaults_except_namespace() -> None:
    """The chart's defaults are the webhook's built-in defaults (webhook/examples/policy.yaml)."""
    config = parse_config(policy_of(objects()))
    builtin = parse_config({})
    differ = {"exempt_namespaces", "sharing", "inject_runtime_class_name", "nvidia_runtime_is_default"}
    assert config.model_dump(exclude=differ) == builtin.model_dump(exclude=differ)
    assert config.exempt_namespaces == (NAMESPACE, "kube-system")
    # the chart's runtime layout: nvidia is not the default runtime, so GPU pods get it from the webhook
    assert config.inject_runtime_class_name == "nvidia" and builtin.inject_runtime_class_name == ""
    # ... and only GPU pods run under it; a webhook told nothing assumes every pod may.
    assert config.nvidia_runtime_is_default is False and builtin.nvidia_runtime_is_default is True


def test_rule_ids_in_schema_are_the_webhooks() -> None:
    enum = load_schema()["properties"]["webhook"]["properties"]["policy"]["properties"]["rules"]["properties"][
        "disabled"]["items"]["enum"]
    assert set(enum) == set(RULE_IDS)


def test_policy_change_rolls_the_pods() -> None:
    def checksum(objs: list[dict[str, Any]]) -> str:
        return one(objs, "Deployment", WEBHOOK)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    base = checksum(objects())
    assert len(base) == 64
    assert checksum(objects(**{"webhook.policy.rules.migUnexposed": "warn"})) != base
    assert checksum(objects(**{"sharing.configs": {"default": {"migStrategy": "single"}}})) != base
    assert checksum(objects(**{"webhook.replicas": 3})) == base


# ---- Deployment ------------------------------------------------------------------------------------


def _deployment(**set_json: Any) -> dict[str, Any]:
    return one(objects(**set_json), "Deployment", WEBHOOK)


def test_deployment_basics() -> None:
    dep = _deployment()
    spec = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2
    (container,) = spec["containers"]
    assert container["image"] == MARKER_IMAGE
    # self-managed TLS (the default) and cluster lookups: the webhook is told its Secret, Service and configurations
    assert container["command"] + container["args"] == [
        "gpu-stack-webhook", "serve", "--config", "/etc/gpu-stack/policy/policy.yaml", *SELF_MANAGED_ARGS,
        "--cluster-lookups", "--runtime-classes", "live", "--policy-source-interval", "2s",
        "--policy-source-keep", "10s", "--bind", "0.0.0.0:8443"]
    assert {"name": "GPU_STACK_WEBHOOK_CONFIG", "value": "/etc/gpu-stack/policy/policy.yaml"} in container["env"]
    assert container["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["automountServiceAccountToken"] is True  # it talks to the API
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    # a directory mount (no subPath), so ConfigMap updates reach the running webhook, which reloads them
    policy_mount = mounts["/etc/gpu-stack/policy"]
    assert "subPath" not in policy_mount and policy_mount["readOnly"] is True
    assert volumes[policy_mount["name"]]["configMap"]["name"] == POLICY_CM
    # no Secret volume (the pod starts before the Secret exists): the webhook writes the pair to an emptyDir
    assert "emptyDir" in volumes[mounts["/run/gpu-stack/tls"]["name"]]
    assert not mounts["/run/gpu-stack/tls"].get("readOnly")
    assert not [v for v in spec["volumes"] if "secret" in v]
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]


def test_deployment_with_a_mounted_certificate() -> None:
    for values in (NO_CERT_MANAGER, CERT_MANAGER):
        dep = _deployment(**values, **{"webhook.lookups.enabled": False})
        spec = dep["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        assert container["args"] == ["serve", "--config", "/etc/gpu-stack/policy/policy.yaml", "--cert",
                                     "/etc/gpu-stack/tls/tls.crt", "--key", "/etc/gpu-stack/tls/tls.key", "--bind",
                                     "0.0.0.0:8443"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes[mounts["/etc/gpu-stack/tls"]]["secret"]["secretName"] == TLS_SECRET
        assert spec["automountServiceAccountToken"] is False  # no API access at all


def test_deployment_spreads_across_nodes() -> None:
    spec = _deployment()["spec"]["template"]["spec"]
    selector = _deployment()["spec"]["selector"]["matchLabels"]
    (tsc,) = spec["topologySpreadConstraints"]
    assert tsc["topologyKey"] == "kubernetes.io/hostname" and tsc["labelSelector"]["matchLabels"] == selector
    (anti,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert anti["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
    assert _deployment()["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_image_tag_and_pull_secrets_from_values() -> None:
    dep = _deployment(**{"webhook.image.tag": "1.2.3", "webhook.imagePullSecrets": [{"name": "regcred"}]})
    spec = dep["spec"]["template"]["spec"]
    assert spec["containers"][0]["image"].endswith(":1.2.3")
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]


# ---- webhook image: none is published ---------------------------------------------------------------


def _images(node: Any) -> list[str]:
    """Every `image` of every container, init container and helm test pod in the render."""
    if isinstance(node, dict):
        own = [node["image"]] if isinstance(node.get("image"), str) else []
        return own + [i for k, v in node.items() if k != "image" for i in _images(v)]
    if isinstance(node, list):
        return [i for v in node for i in _images(v)]
    return []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_default_names_an_unpublished_image(overlay: str) -> None:
    objs = render(3, overlay).objects()
    assert [i for i in _images(objs) if "ghcr.io/gpu-stack" in i] == []
    (container,) = one(objs, "Deployment", WEBHOOK)["spec"]["template"]["spec"]["containers"]
    assert container["image"] == MARKER_IMAGE


def test_image_repository_and_tag_from_values(helm: int) -> None:
    repository = "registry.example.com:5000/team/gpu-stack-webhook"
    for values, image in (({"webhook.image.repository": repository}, f"{repository}:{APP_VERSION}"),
                          ({"webhook.image.repository": repository, "webhook.image.tag": "2024.1-rc1"},
                           f"{repository}:2024.1-rc1")):
        objs = render(helm, set_json=values).objects()
        (container,) = one(objs, "Deployment", WEBHOOK)["spec"]["template"]["spec"]["containers"]
        assert container["image"] == image
        assert [i for i in _images(objs) if "gpu-stack-webhook" in i] == [image]


@pytest.mark.parametrize(("values", "image"), [
    ({"webhook.image.repository": "ghcr.io/gpu-stack/gpu-stack-webhook",
      "webhook.image.registry": "mirror.example:5000"},
     f"mirror.example:5000/gpu-stack/gpu-stack-webhook:{APP_VERSION}"),
    ({"webhook.image.repository": "localhost/gpu-stack-webhook", "webhook.image.registry": "mirror.example"},
     f"mirror.example/gpu-stack-webhook:{APP_VERSION}"),
    ({"webhook.image.repository": "team/gpu-stack-webhook", "webhook.image.registry": "mirror.example"},
     f"mirror.example/team/gpu-stack-webhook:{APP_VERSION}"),
    ({"webhook.image.repository": "r.example/gpu-stack-webhook", "webhook.image.tag": "9.9.9",
      "webhook.image.digest": "sha256:" + "ab" * 32}, "r.example/gpu-stack-webhook@sha256:" + "ab" * 32),
])
def test_a_mirror_registry_and_a_digest(helm: int, values: dict[str, str], image: str) -> None:
    objs = render(helm, set_json=values).objects()
    (container,) = one(objs, "Deployment", WEBHOOK)["spec"]["template"]["spec"]["containers"]
    assert container["image"] == image


@pytest.mark.parametrize(("key", "value"), [
    ("repository", "registry.example.com/gpu-stack-webhook:0.1.0"),  # the tag belongs in webhook.image.tag
    ("repository", "registry.example.com/gpu-stack-webhook@sha256:0123"),
    ("repository", "Registry/GPU"),
    ("tag", "-dev"),
    ("tag", "0.1.0 "),
    ("registry", "mirror.example/path"),
    ("digest", "sha256:0123"),
    ("digest", "0.1.0"),
])
def test_image_values_are_checked_by_the_schema(helm: int, key: str, value: str) -> None:
    failed = run_helm(helm, template_args(set_json={f"webhook.image.{key}": value}))
    assert not failed.ok
    assert f"webhook/image/{key}" in failed.stderr.replace(".", "/"), failed.stderr


def test_cel_only_renders_no_webhook_image(helm: int) -> None:
    cel = {"webhook.cel.assumeServed": True, "webhook.validation.mode": "cel", "webhook.mutation.mode": "cel"}
    objs = render(helm, set_json=cel).objects()
    assert not find(objs, "Deployment", WEBHOOK)
    assert [i for i in _images(objs) if "gpu-stack-webhook" in i] == []


def test_webhook_meets_pod_security_restricted() -> None:
    # tests/chart/test_pod_security.py checks every component against the full Pod Security Standards;
    # here, what the webhook adds beyond them
    spec = _deployment()["spec"]["template"]["spec"]
    assert pss.check(spec) == []
    container = spec["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["runAsUser"] == 65532


# ---- Service, PDB, ServiceAccount, RBAC ---------------------------------------------------------------


def test_service_targets_the_webhook_pods() -> None:
    objs = objects()
    svc = one(objs, "Service", WEBHOOK)
    dep = one(objs, "Deployment", WEBHOOK)
    assert svc["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in svc["spec"]["selector"].items())


def test_pdb() -> None:
    objs = objects()
    pdb = one(objs, "PodDisruptionBudget", WEBHOOK)
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == one(objs, "Deployment", WEBHOOK)["spec"]["selector"]["matchLabels"]
    assert not find(objects(**{"webhook.podDisruptionBudget.enabled": False}), "PodDisruptionBudget")


SELF_MANAGED_ROLE = [
    {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [TLS_SECRET],
     "verbs": ["get", "update", "list", "watch"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
]
SELF_MANAGED_CLUSTER_RULE = {"apiGroups": ["admissionregistration.k8s.io"],
                             "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
                             "resourceNames": [WEBHOOK], "verbs": ["get", "patch"]}
# nodes: a pod pinned with spec.nodeName is judged against its node's device plugin config label
LOOKUP_CLUSTER_RULE = {"apiGroups": [""], "resources": ["configmaps", "namespaces", "nodes"], "verbs": ["get"]}
# the ResourceClaims and ResourceClaimTemplates a pod names (DRA): do they hold GPUs? (get only)
CLAIM_CLUSTER_RULE = {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceclaimtemplates"],
                      "verbs": ["get"]}
# every RuntimeClass's handler: which select the NVIDIA runtime (read every policySource.interval)
RUNTIME_CLASS_RULE = {"apiGroups": ["node.k8s.io"], "resources": ["runtimeclasses"], "verbs": ["get", "list"]}
RBAC_KINDS = ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


def _webhook_rbac(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] in RBAC_KINDS and o["metadata"]["name"] == WEBHOOK]


def test_rbac_is_exactly_what_self_managed_tls_and_lookups_need() -> None:
    objs = objects()
    assert one(objs, "ServiceAccount", WEBHOOK)["automountServiceAccountToken"] is False  # the pod opts in
    role = one(objs, "Role", WEBHOOK)
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == SELF_MANAGED_ROLE
    assert one(objs, "ClusterRole", WEBHOOK)["rules"] == [SELF_MANAGED_CLUSTER_RULE, LOOKUP_CLUSTER_RULE,
                                                          CLAIM_CLUSTER_RULE, RUNTIME_CLASS_RULE]
    # nothing for Secrets cluster-wide, anywhere in the webhook's rules
    cluster_resources = {r for rule in one(objs, "ClusterRole", WEBHOOK)["rules"] for r in rule["resources"]}
    assert "secrets" not in cluster_resources
    for kind, role_kind in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
        binding = one(objs, kind, WEBHOOK)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": WEBHOOK}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": WEBHOOK, "namespace": NAMESPACE}]


def test_rbac_follows_the_tls_mode_and_lookups() -> None:
    objs = objects(**CERT_MANAGER)
    assert not find(objs, "Role", WEBHOOK)
    assert one(objs, "ClusterRole", WEBHOOK)["rules"] == [LOOKUP_CLUSTER_RULE, CLAIM_CLUSTER_RULE, RUNTIME_CLASS_RULE]
    objs = objects(**CERT_MANAGER, **{"webhook.lookups.enabled": False})
    assert _webhook_rbac(objs) == []
    assert one(objs, "Deployment", WEBHOOK)["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    objs = objects(**{"webhook.lookups.enabled": False})
    assert one(objs, "ClusterRole", WEBHOOK)["rules"] == [SELF_MANAGED_CLUSTER_RULE]


def test_rbac_values_hook() -> None:
    rule = {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [TLS_SECRET],
            "verbs": ["get", "update", "list", "watch"]}
    crule = {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
             "verbs": ["get", "patch"]}
    objs = objects(**{"webhook.rbac.extraRules": [rule], "webhook.rbac.extraClusterRules": [crule]})
    assert one(objs, "Role", WEBHOOK)["rules"] == [*SELF_MANAGED_ROLE, rule]
    assert one(objs, "ClusterRole", WEBHOOK)["rules"] == [SELF_MANAGED_CLUSTER_RULE, LOOKUP_CLUSTER_RULE,
                                                          CLAIM_CLUSTER_RULE, RUNTIME_CLASS_RULE, crule]
    objs = objects(**CERT_MANAGER, **{"webhook.lookups.enabled": False, "webhook.rbac.extraRules": [rule],
                                      "webhook.rbac.extraClusterRules": [crule]})
    assert one(objs, "Role", WEBHOOK)["rules"] == [rule]
    assert one(objs, "ClusterRole", WEBHOOK)["rules"] == [crule]
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        binding = one(objs, kind, WEBHOOK)
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": WEBHOOK, "namespace": NAMESPACE}]
    assert one(objs, "Deployment", WEBHOOK)["spec"]["template"]["spec"]["automountServiceAccountToken"] is True


# ---- webhook configurations --------------------------------------------------------------------------


def _configs(objs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    (m,) = one(objs, "MutatingWebhookConfiguration", WEBHOOK)["webhooks"]
    (v,) = one(objs, "ValidatingWebhookConfiguration", WEBHOOK)["webhooks"]
    return m, v


def _rules(hook: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(g, r, op) for rule in hook["rules"] for g in rule["apiGroups"] for r in rule["resources"]
            for op in rule["operations"]}


def test_webhook_configurations() -> None:
    m, v = _configs(objects())
    assert (m["name"], v["name"]) == ("mutate.gpu-stack.io", "validate.gpu-stack.io")
    for hook, path in ((m, "/mutate"), (v, "/validate")):
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["sideEffects"] == "None"
        assert hook["matchPolicy"] == "Equivalent"
        assert hook["failurePolicy"] == "Fail"
        assert hook["timeoutSeconds"] == 10
        assert hook["clientConfig"]["service"] == {"name": WEBHOOK, "namespace": NAMESPACE, "path": path, "port": 443}
    assert m["reinvocationPolicy"] == "IfNeeded"
    claims = {("resource.k8s.io", r, "CREATE") for r in ("resourceclaims", "resourceclaimtemplates")}
    assert _rules(m) == {("", "pods", "CREATE")} | claims
    expected = {("", "pods", "CREATE"), ("", "pods", "UPDATE"), ("", "pods/ephemeralcontainers", "UPDATE")}
    expected |= claims | {("resource.k8s.io", r, "UPDATE") for r in ("resourceclaims", "resourceclaimtemplates")}
    expected |= {("apps", r, op) for r in ("deployments", "replicasets", "statefulsets", "daemonsets")
                 for op in ("CREATE", "UPDATE")}
    expected |= {("batch", r, op) for r in ("jobs", "cronjobs") for op in ("CREATE", "UPDATE")}
    assert _rules(v) == expected


def test_validating_rules_cover_what_the_recorded_apiserver_sent() -> None:
    """Every (group, resource, CREATE/UPDATE) the real apiserver was registered for (shared fixtures) is
    covered by the validating webhook (DELETE is not judged)."""
    path = ROOT / "tests/fixtures/apiserver-v1.36/admission-requests/webhook-configurations.json"
    assert path.exists(), f"recorded fixture absent: {path} (tests/fixtures/README.md)"
    recorded = json.loads(path.read_text())
    (vwc,) = [i for i in recorded["items"] if i["kind"] == "ValidatingWebhookConfiguration"]
    wanted = {r for r in _rules(vwc["webhooks"][0]) if r[2] != "DELETE"} - {("", "pods/ephemeralcontainers", "CREATE")}
    _, v = _configs(objects())
    assert wanted <= _rules(v)


def test_failure_policy_and_timeout_values() -> None:
    for hook in _configs(objects(**{"webhook.failurePolicy": "Ignore", "webhook.timeoutSeconds": 5})):
        assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Ignore", 5)


def test_namespace_selector_skips_exempt_and_opted_out_namespaces() -> None:
    objs = objects(**{"webhook.policy.extraExemptNamespaces": ["monitoring"],
                      "webhook.namespaceOptOutLabel": "gpu-stack.io/webhook"})
    for hook in _configs(objs):
        assert hook["namespaceSelector"] == {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
             "values": [NAMESPACE, "kube-system", "monitoring"]},
            {"key": "gpu-stack.io/webhook", "operator": "NotIn", "values": ["disabled"]},
        ]}
    assert policy_of(objs)["exemptNamespaces"] == [NAMESPACE, "kube-system", "monitoring"]


def test_webhook_disabled_renders_no_webhook_objects() -> None:
    objs = objects(**{"webhook.enabled": False})
    assert not [o for o in objs if o["metadata"]["name"].startswith(WEBHOOK)]
    assert not find(objs, "MutatingWebhookConfiguration") and not find(objs, "ValidatingWebhookConfiguration")


# ---- TLS -----------------------------------------------------------------------------------------------


def test_self_managed_tls_renders_no_certificate_and_no_ca_bundle() -> None:
    objs = objects()
    assert not find(objs, "Certificate") and not find(objs, "Issuer") and not find(objs, "Secret", TLS_SECRET)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = one(objs, kind, WEBHOOK)
        assert "annotations" not in config["metadata"]  # no cainjector
        assert "caBundle" not in config["webhooks"][0]["clientConfig"]  # the webhook patches it
    # what the webhook is told to patch and to serve is what the chart renders
    args = one(objs, "Deployment", WEBHOOK)["spec"]["template"]["spec"]["containers"][0]["args"]
    flag = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
    assert flag["--mutating-webhook-configuration"] == one(objs, "MutatingWebhookConfiguration", WEBHOOK)[
        "metadata"]["name"]
    assert flag["--validating-webhook-configuration"] == one(objs, "ValidatingWebhookConfiguration", WEBHOOK)[
        "metadata"]["name"]
    assert flag["--service"] == one(objs, "Service", WEBHOOK)["metadata"]["name"]
    assert flag["--namespace"] == NAMESPACE and flag["--tls-secret"] == TLS_SECRET


def test_two_renders_are_byte_identical() -> None:
    first = run_helm(3, template_args())
    second = run_helm(3, template_args())
    assert first.ok and first.stdout == second.stdout


def test_cert_manager_chain() -> None:
    objs = objects(**CERT_MANAGER)
    issuers = {o["metadata"]["name"]: o for o in find(objs, "Issuer")}
    certs = {o["metadata"]["name"]: o for o in find(objs, "Certificate")}
    selfsigned, ca_issuer = issuers[f"{WEBHOOK}-selfsigned"], issuers[f"{WEBHOOK}-ca"]
    assert selfsigned["spec"] == {"selfSigned": {}}
    ca = certs[f"{WEBHOOK}-ca"]
    assert ca["spec"]["isCA"] is True
    assert ca["spec"]["issuerRef"]["name"] == selfsigned["metadata"]["name"]
    assert ca_issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    serving = certs[TLS_SECRET]
    assert serving["spec"]["issuerRef"]["name"] == ca_issuer["metadata"]["name"]
    assert serving["spec"]["secretName"] == TLS_SECRET
    assert serving["spec"]["privateKey"]["algorithm"] == "ECDSA" and serving["spec"]["privateKey"]["size"] == 256
    assert serving["spec"]["dnsNames"] == [f"{WEBHOOK}.{NAMESPACE}.svc", f"{WEBHOOK}.{NAMESPACE}.svc.cluster.local"]
    for hook_kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = one(objs, hook_kind, WEBHOOK)
        assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{TLS_SECRET}"
        assert "caBundle" not in config["webhooks"][0]["clientConfig"]


def test_user_provided_tls_secret_and_ca_bundle() -> None:
    objs = objects(**NO_CERT_MANAGER, **{"webhook.tls.secretName": "my-webhook-cert"})
    assert not find(objs, "Certificate") and not find(objs, "Issuer")
    for hook in _configs(objs):
        assert base64.b64decode(hook["clientConfig"]["caBundle"]).decode() == CA_PEM.strip()
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert "annotations" not in one(objs, kind, WEBHOOK)["metadata"]
    volumes = one(objs, "Deployment", WEBHOOK)["spec"]["template"]["spec"]["volumes"]
    assert {"secretName": "my-webhook-cert", "defaultMode": 0o440} in [v.get("secret") for v in volumes]


def test_ca_bundle_must_be_pem() -> None:
    result = render(3, set_json={"webhook.tls.mode": "secret", "webhook.tls.caBundle": "bm90IGEgY2VydA=="})
    assert not result.ok and "caBundle" in result.stderr


# ---- helm tests and NOTES ----------------------------------------------------------------------------


def _hooks(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]


def test_helm_tests_stay_in_the_release_namespace_by_default() -> None:
    """Without webhook.helmTests.namespace nothing of the chart lands in `default`: the CUDA sample runs in the
    release namespace, and the denial test, which needs a namespace the webhook covers, is not rendered."""
    objs = objects()
    assert {o["metadata"].get("namespace", NAMESPACE) for o in objs} == {NAMESPACE}
    pods = {p["metadata"]["name"]: p for p in _hooks(objs) if p["kind"] == "Pod"}
    assert f"{FULLNAME}-test-cuda" in pods and f"{FULLNAME}-test-webhook" not in pods
    assert {p["metadata"]["namespace"] for p in pods.values()} == {NAMESPACE}
    assert not find(objs, "Role", f"{FULLNAME}-test-webhook")


def test_helm_test_hooks() -> None:
    objs = render(3, set_json={"webhook.helmTests.namespace": "gpu-check"}).objects()
    hooks = _hooks(objs)
    pods = {p["metadata"]["name"]: p for p in hooks if p["kind"] == "Pod"}
    deny = pods[f"{FULLNAME}-test-webhook"]
    cuda = pods[f"{FULLNAME}-test-cuda"]
    script = deny["spec"]["containers"][0]["args"][0]
    assert "--dry-run=server" in script and '--overrides="$DENIED_POD_OVERRIDES"' in script
    assert 'admission webhook "validate.gpu-stack.io" denied the request' in script
    env = {e["name"]: e["value"] for e in deny["spec"]["containers"][0]["env"]}
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in json.loads(env["DENIED_POD_OVERRIDES"])["spec"][
        "containers"][0]["env"]
    # The release namespace is exempt, so the denial is tried in one the webhook covers.
    assert env["TEST_NAMESPACE"] == "gpu-check"
    assert env["TEST_NAMESPACE"] not in policy_of(objs)["exemptNamespaces"]
    role = one(hooks, "Role", f"{FULLNAME}-test-webhook")
    assert role["metadata"]["namespace"] == "gpu-check"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]
    binding = one(hooks, "RoleBinding", f"{FULLNAME}-test-webhook")
    assert binding["subjects"][0] == {"kind": "ServiceAccount", "name": deny["spec"]["serviceAccountName"],
                                      "namespace": NAMESPACE}
    assert cuda["spec"]["containers"][0]["image"] == "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0"
    assert cuda["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert cuda["spec"]["restartPolicy"] == "Never"
    # Helm creates test hooks by ascending weight: RBAC before the pod that needs it.
    weight = {(h["kind"], h["metadata"]["name"]): int(h["metadata"]["annotations"]["helm.sh/hook-weight"])
              for h in hooks}
    assert weight[("Role", f"{FULLNAME}-test-webhook")] < weight[("Pod", f"{FULLNAME}-test-webhook")]
    assert weight[("RoleBinding", f"{FULLNAME}-test-webhook")] < weight[("Pod", f"{FULLNAME}-test-webhook")]


def test_helm_test_in_default_namespace_release() -> None:
    """Installed into `default` (exempt), the denial test has nowhere to run and is skipped."""
    objs = render(3, namespace="default").objects()
    pods = {p["metadata"]["name"]: p for p in _hooks(objs) if p["kind"] == "Pod"}
    assert f"{FULLNAME}-test-webhook" not in pods
    assert pods[f"{FULLNAME}-test-cuda"]["metadata"]["namespace"] == "default"
    objs = render(3, namespace="default", set_json={"webhook.helmTests.namespace": "gpu-check"}).objects()
    assert one(_hooks(objs), "Role", f"{FULLNAME}-test-webhook")["metadata"]["namespace"] == "gpu-check"


def _notes(*extra: str) -> str:
    # Helm 4 renders NOTES for a client-side dry run without a cluster.
    result = run_helm(4, ["install", "--dry-run=client", *template_args(api_versions=())[1:], *extra])
    assert result.ok, result.stderr
    return result.stdout.split("NOTES:", 1)[1]


def test_notes() -> None:
    notes = _notes()
    assert f"kubectl get pods -n {NAMESPACE}" in notes
    assert "nvidia.com/gpu.count" in notes
    assert "nvidia.com/device-plugin.config=<config>" in notes
    for name in overlay_values("default")["sharing"]["configs"]:
        assert f"  - {name}:" in notes
    assert "webhook: on" in notes
    assert "TLS (self-managed): the webhook keeps its CA and certificate in Secret t-gpu-stack-webhook-tls" in notes
    assert "WARNING" not in notes


def notes_check(notes: str) -> tuple[list[str], str]:
    """The post-install check NOTES prints: the kubectl command, split as a shell would, and the line after it."""
    lines = notes.splitlines()
    (index,) = [i for i, line in enumerate(lines) if line.strip().startswith("kubectl run gpu-stack-check ")]
    return shlex.split(lines[index]), lines[index + 1].strip()


def test_the_notes_check_is_a_gpu_pod_that_sets_nvidia_visible_devices() -> None:
    """GPU002 denies NVIDIA_VISIBLE_DEVICES in a GPU pod on every runtime layout; a pod without a GPU is not
    even sent to the webhook where the NVIDIA runtime is not the nodes' default (matchConditions)."""
    argv, _ = notes_check(_notes())
    assert argv[:3] == ["kubectl", "run", "gpu-stack-check"]
    assert "--dry-run=server" in argv and "--namespace" in argv
    overrides = json.loads(next(a.split("=", 1)[1] for a in argv if a.startswith("--overrides=")))
    (container,) = overrides["spec"]["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in container["env"]


@pytest.mark.parametrize(("values", "namespace"), [
    ((), "default"),
    (("--set", "webhook.helmTests.namespace=ml"), "ml"),
    (("--set-json", 'webhook.policy.extraExemptNamespaces=["default"]'), "<namespace>"),
])
def test_the_notes_check_runs_in_a_namespace_the_webhook_covers(values: tuple[str, ...], namespace: str) -> None:
    argv, _ = notes_check(_notes(*values))
    assert argv[argv.index("--namespace") + 1] == namespace


@pytest.mark.parametrize(("values", "expected"), [
    ((), 'admission webhook "validate.gpu-stack.io" denied the request: GPU002'),
    (("--set", "webhook.validation.mode=both", "--set", "webhook.cel.assumeServed=true"),
     "ValidatingAdmissionPolicy 't-gpu-stack-gpu002' with binding 't-gpu-stack-gpu002' denied request: GPU002"),
    (("--set", "webhook.validation.mode=cel", "--set", "webhook.mutation.mode=cel", "--set",
      "webhook.cel.assumeServed=true"),
     "ValidatingAdmissionPolicy 't-gpu-stack-gpu002' with binding 't-gpu-stack-gpu002' denied request: GPU002"),
    (("--set", "webhook.validation.mode=cel", "--set", "webhook.cel.assumeServed=true", "--set-json",
      'webhook.validation.celActions=["Warn","Audit"]'), "admitted with a warning"),
])
def test_the_notes_say_who_answers_the_check(values: tuple[str, ...], expected: str) -> None:
    _, answer = notes_check(_notes(*values))
    assert answer.startswith("# -> ") and expected in answer, answer


def test_notes_list_the_rules_the_cel_policies_judge() -> None:
    notes = _notes("--set", "webhook.validation.mode=both", "--set", "webhook.cel.assumeServed=true")
    generated = yaml.safe_load((CHART / "files" / "cel-policies.yaml").read_text())
    assert f"itself judges {', '.join(p['rule'] for p in generated['validating'])}:" in notes
    assert "GPU009" in notes


def test_notes_warn_about_a_single_fail_closed_replica() -> None:
    notes = _notes("--set", "webhook.replicas=1", "--set", "webhook.podDisruptionBudget.enabled=false")
    assert "WARNING: webhook.replicas is 1 with failurePolicy Fail" in notes


def test_workers_threads_and_a_readiness_probe_inside_the_review_deadline() -> None:
    """The serving size comes from values (env read by gunicorn_conf.ServeOptions), and the
    readiness probe is an HTTPS request to the same workers with a 1 s timeout, shorter than the
    apiserver's timeoutSeconds: a pod that cannot answer reviews leaves the Service."""
    container = _deployment()["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert (env["GPU_STACK_WEBHOOK_WORKERS"], env["GPU_STACK_WEBHOOK_THREADS"]) == ("2", "4")
    probe = container["readinessProbe"]
    assert "httpGet" in probe and "tcpSocket" not in probe
    assert probe["timeoutSeconds"] == 1 and probe["failureThreshold"] == 2
    hooks = _configs(objects())
    assert all(probe["timeoutSeconds"] < hook["timeoutSeconds"] for hook in hooks)
    resized = objects(**{"webhook.workers": 4, "webhook.threads": 2})
    container = one(resized, "Deployment", WEBHOOK)["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert (env["GPU_STACK_WEBHOOK_WORKERS"], env["GPU_STACK_WEBHOOK_THREADS"]) == ("4", "2")


@pytest.mark.parametrize(("set_json", "want"), [
    ({}, []),
    # The chart's DRA driver with MPS claims: the webhook lets claims ask for MPS (GPU009).
    ({"dra.enabled": True, "dra.featureGates": {"MPSSupport": True}}, ["MPS"]),
    ({"dra.enabled": True, "dra.featureGates": {"MPSSupport": True, "TimeSlicingSettings": True}},
     ["MPS", "TimeSlicing"]),
    # A gate turned off, or the driver not deployed by this chart, enables nothing.
    ({"dra.enabled": True, "dra.featureGates": {"MPSSupport": False}}, []),
    ({"dra.featureGates": {"MPSSupport": True}}, []),
    # A driver deployed some other way: the policy list alone, merged with the chart's own.
    ({"webhook.policy.dra.sharingStrategies": ["TimeSlicing"]}, ["TimeSlicing"]),
    ({"webhook.policy.dra.sharingStrategies": ["MPS", "TimeSlicing"], "dra.enabled": True,
      "dra.featureGates": {"MPSSupport": True}}, ["MPS", "TimeSlicing"]),
])
def test_dra_sharing_strategies_follow_the_drivers_feature_gates(set_json: dict[str, Any], want: list[str]) -> None:
    policy = policy_of(objects(**set_json))
    assert policy["dra"]["sharingStrategies"] == want
    parse_config(policy, "policy")
