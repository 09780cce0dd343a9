"""The side doors to GPUs: each attack judged offline through the policy, then live through
/mutate and /validate of `gpu-stack-webhook serve` over TLS (the /mutate patch applied first, as the
apiserver does), and `kubectl debug` as the recorded UPDATE pods/ephemeralcontainers review.

Upstream facts these cases rely on (each is the reason for an expectation below):
- nvidia-container-toolkit v1.20.0 internal/config/image/privileged.go: IsPrivileged is true when the
  bounding capability set holds "CAP_SYS_ADMIN" (privileged: true, add SYS_ADMIN or add ALL).
- nvidia-container-toolkit v1.20.0 internal/config/image/cuda_image.go: VisibleDevices honours the
  image's NVIDIA_VISIBLE_DEVICES when `isPrivileged || acceptEnvvarUnprivileged`; a "legacy" image
  (CUDA_VERSION without NVIDIA_REQUIRE_CUDA) defaults to "all"; device-list mounts and CDI
  annotations are read first, so the device plugin's list for a container wins over the image env.
- How runtimes read capability names (why every spelling counts): containerd's CRI plugin
  (WithCapabilities) matches ALL case-insensitively and adds "CAP_" + strings.ToUpper(name) for the
  rest; CRI-O also takes names already prefixed with CAP_. Surrounding blanks are ignored by the rule
  to stay on the safe side.
- k8s-device-plugin v0.20.0 internal/plugin/server.go getAllocateResponse: volume-mounts also sets
  NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices; with only CDI strategies nothing of the
  sort is set (so cdi-cri alone does not override the image env).
- k8s-device-plugin v0.20.0 api/config/v1/resources.go NewResourceName: names without the
  "nvidia.com/" prefix get it; consts.go DefaultSharedResourceNameSuffix ".shared".
- k8s-device-plugin v0.20.0 api/config/v1/config.go: NewConfig sets MPS failRequestsGreaterThanOne to
  true only when unset; DisableResourceNamingInConfig drops `rename` (or forces <name>.shared with
  renameByDefault) and resets `devices` to all.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_stack_webhook.admission import decide as admission_decide
from gpu_stack_webhook.admission.decide import Endpoint
from gpu_stack_webhook.admission.review import parse_review
from gpu_stack_webhook.kube.lookups import ApiFacts
from gpu_stack_webhook.policy.config import PolicyConfig
from gpu_stack_webhook.policy.engine import Policy

from .kube_fake import FakeKube, fake_apiserver, kubeconfig
from .podlib import apply_patch, container, make_pod, review, wrap
from .policylib import make_config
from .recordlib import recorded
from .tls_helpers import Client, Server, make_pki, running_server

LABEL = "nvidia.com/device-plugin.config"
RDMA = "nvidia.com/rdma_shared_device_a"


def _plugin(strategy: list[str] | None = None, **sharing: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": "none",
                                                      "plugin": {"deviceListStrategy": strategy or ["volume-mounts"]}}}
    if sharing:
        cfg["sharing"] = sharing
    return cfg


# One policy for the offline and the live runs: an exclusive default, MPS and time-slicing configs that
# name the GPU the bare way (`name: gpu`), and an exclusive config whose plugin uses cdi-cri only.
POLICY: dict[str, Any] = {
    "injectRuntimeClassName": "nvidia",
    "sharing": {
        "defaultConfig": "default",
        "configs": {
            "default": _plugin(),
            "mps-bare": _plugin(mps={"resources": [{"name": "gpu", "replicas": 10}]}),
            "ts-bare": _plugin(timeSlicing={"renameByDefault": True, "failRequestsGreaterThanOne": True,
                                            "resources": [{"name": "gpu", "replicas": 4}]}),
            "mps-relaxed": _plugin(mps={"failRequestsGreaterThanOne": False,
                                        "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}),
            "cdi-cri": _plugin(["cdi-cri"]),
        },
    },
}


def caps(name: str = "side", *, add: list[Any] | None = None, drop: list[Any] | None = None,
         **kw: Any) -> dict[str, Any]:
    c = container(name, image="busybox:1.36", **kw)
    capabilities = {k: v for k, v in (("add", add), ("drop", drop)) if v is not None}
    c["securityContext"] = {"capabilities": capabilities}
    return c


def on(config: str, pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["nodeSelector"] = {LABEL: config}
    return pod


GPU_MAIN = container("main", gpu=1)


@dataclass(frozen=True)
class Case:
    pod: dict[str, Any]
    rule: str = ""  # "" = allowed; else the rule the denial names
    words: tuple[str, ...] = ()  # in the denial message
    mutated: dict[str, Any] = field(default_factory=dict)  # pod spec fields the /mutate patch sets


CASES: dict[str, Case] = {
    # ---- 1. CAP_SYS_ADMIN is privileged to the NVIDIA runtime -----------------------------------------------
    **{f"sys-admin-sidecar-{spelling}": Case(make_pod([GPU_MAIN, caps(add=[spelling])]), "GPU003",
                                             (f'container "side" adds capability {spelling}', "CAP_SYS_ADMIN"))
       for spelling in ("SYS_ADMIN", "sys_admin", "CAP_SYS_ADMIN", "Cap_Sys_Admin", "ALL", "all", "CAP_ALL", " ALL ")},
    "sys-admin-init-container": Case(make_pod([GPU_MAIN], init=[caps("init", add=["SYS_ADMIN"])]), "GPU003",
                                     ('initContainer "init" adds capability SYS_ADMIN',)),
    "sys-admin-ephemeral-container": Case(make_pod([GPU_MAIN], ephemeral=[caps("dbg", add=["ALL"])]), "GPU003",
                                          ('ephemeralContainer "dbg" adds capability ALL',)),
    # drop never excuses an add
    "sys-admin-added-and-dropped": Case(make_pod([GPU_MAIN, caps(add=["ALL"], drop=["SYS_ADMIN"])]), "GPU003"),
    # no GPU request, but the NVIDIA runtime class: the runtime runs every container of the pod
    "sys-admin-runtime-class-no-request": Case(make_pod([caps("main", add=["SYS_ADMIN"])], runtimeClassName="nvidia"),
                                               "GPU003"),
    # a request of 0 is no allocation, but it is a GPU pod (and gets the runtime class)
    "sys-admin-zero-gpu-request": Case(make_pod([caps("main", add=["SYS_ADMIN"], gpu=0)]), "GPU003"),
    # cdi-cri alone sets nothing the NVIDIA runtime reads: an own GPU does not override the image env there
    "sys-admin-own-gpu-under-cdi-cri": Case(on("cdi-cri", make_pod([caps("prof", add=["SYS_ADMIN"], gpu=1)])),
                                            "GPU003"),
    # allowed: a profiler with its own GPU (the plugin's device list wins over the image env)
    "profiler-own-gpu-sys-admin-allowed": Case(on("default", make_pod([caps("prof", add=["SYS_ADMIN"], gpu=1)])),
                                               mutated={"runtimeClassName": "nvidia"}),
    # ... but not where it could land on a cdi-cri node (no nodeSelector: every config counts)
    "profiler-own-gpu-any-node-incl-cdi-cri": Case(make_pod([caps("prof", add=["SYS_ADMIN"], gpu=1)]), "GPU003"),
    "drop-all-allowed": Case(make_pod([GPU_MAIN, caps(drop=["ALL"])]), mutated={"runtimeClassName": "nvidia"}),
    "mesh-init-net-admin-allowed": Case(make_pod([GPU_MAIN], init=[caps("istio-init", add=["NET_ADMIN", "NET_RAW"])]),
                                        mutated={"runtimeClassName": "nvidia"}),
    "sys-admin-outside-gpu-pods-allowed": Case(make_pod([caps("main", add=["SYS_ADMIN"])])),
    # ---- 3. bare resource names are prefixed like the device plugin does -------------------------------------
    "bare-mps-name-two-gpus": Case(on("mps-bare", make_pod([container("main", gpu=2)])), "GPU004",
                                   ("requests 2 nvidia.com/gpu", "mps-bare")),
    "bare-ts-renamed-two-shared": Case(on("ts-bare", make_pod([container("main", requests={"nvidia.com/gpu.shared": 2},
                                                                         limits={"nvidia.com/gpu.shared": 2})])),
                                       "GPU004", ("nvidia.com/gpu.shared",)),
    # MPS with failRequestsGreaterThanOne: false explicitly: v0.20 lets 2 replicas through
    "mps-relaxed-two-allowed": Case(on("mps-relaxed", make_pod([container("main", gpu=2)])),
                                    mutated={"runtimeClassName": "nvidia", "hostIPC": True}),
    "bare-mps-one-gpu-gets-mps": Case(on("mps-bare", make_pod([container("main", gpu=1)])),
                                      mutated={"runtimeClassName": "nvidia", "hostIPC": True}),
    # ---- 4. which resources are GPUs -------------------------------------------------------------------------
    "privileged-rdma-pod-allowed": Case(make_pod([container("rdma", privileged=True, requests={RDMA: 1},
                                                            limits={RDMA: 1})])),
    "privileged-gpu-shared-denied": Case(make_pod([container("x", privileged=True,
                                                             requests={"nvidia.com/gpu.shared": 1},
                                                             limits={"nvidia.com/gpu.shared": 1})]), "GPU003"),
    "rdma-next-to-gpu-counts-the-gpu": Case(make_pod([GPU_MAIN, container("rdma", privileged=True,
                                                                          requests={RDMA: 1}, limits={RDMA: 1})]),
                                            "GPU003"),
    # ---- 2. GPU pods get the NVIDIA runtime class (it is not the default runtime) -----------------------------
    "gpu-pod-gets-runtime-class": Case(make_pod([GPU_MAIN]), mutated={"runtimeClassName": "nvidia"}),
    "other-runtime-class-kept": Case(make_pod([GPU_MAIN], runtimeClassName="kata"),
                                     mutated={"runtimeClassName": "kata"}),
}


def _policy() -> PolicyConfig:
    return make_config(POLICY)


def _decide_both(pod: dict[str, Any], decide: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """/mutate, apply its patch, then /validate: (validate response, patched pod) or the mutate denial."""
    mutated = decide("/mutate", review(pod))
    if not mutated["allowed"]:
        return mutated, None
    if "patch" in mutated:
        pod = apply_patch(pod, json.loads(base64.b64decode(mutated["patch"])))
    return decide("/validate", review(pod)), pod


def _check(case: Case, response: dict[str, Any], pod: dict[str, Any] | None) -> None:
    if not case.rule:
        assert response["allowed"] is True, response.get("status")
        assert pod is not None
        for key, value in case.mutated.items():
            assert pod["spec"].get(key) == value, (key, pod["spec"].get(key))
        if not case.mutated:
            assert "runtimeClassName" not in pod["spec"]
        return
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    message = response["status"]["message"]
    assert case.rule in message
    for word in case.words:
        assert word in message, message


@pytest.mark.parametrize("name", list(CASES))
def test_offline_through_the_policy(name: str) -> None:
    policy = Policy(_policy())

    def decide(path: str, body: dict[str, Any]) -> dict[str, Any]:
        endpoint = Endpoint(path.strip("/"))
        decision = admission_decide.review(policy, parse_review(body), endpoint)
        from gpu_stack_webhook.admission.pipeline import response_of  # noqa: PLC0415

        return response_of(body["request"]["uid"], decision, allow_patch=endpoint is Endpoint.MUTATE)["response"]

    case = CASES[name]
    _check(case, *_decide_both(copy.deepcopy(case.pod), decide))


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.rule])
def test_workload_templates_are_judged_alike(name: str) -> None:
    case = CASES[name]
    request = parse_review(review(wrap(case.pod, "Deployment")))
    decision = admission_decide.review(Policy(_policy()), request, Endpoint.VALIDATE)
    assert decision.allowed is False and case.rule in decision.message


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("side-doors"), POLICY) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[Client]:
    c = server.client()
    yield c
    c.close()


def _live(client: Client) -> Any:
    def decide(path: str, body: dict[str, Any]) -> dict[str, Any]:
        reply = client.post_json(path, body)
        assert reply.status == 200, reply.body
        return reply.json["response"]  # type: ignore[no-any-return]
    return decide


@pytest.mark.parametrize("name", list(CASES))
def test_live_over_tls_mutate_then_validate(client: Client, name: str) -> None:
    case = CASES[name]
    _check(case, *_decide_both(copy.deepcopy(case.pod), _live(client)))


# ---- kubectl debug: the recorded UPDATE pods/ephemeralcontainers review ---------------------------------


def _debug_review(capabilities: dict[str, Any] | None) -> dict[str, Any]:
    body = recorded("admission-requests/pod-ephemeral-debug-validate.json")
    debugger = body["request"]["object"]["spec"]["ephemeralContainers"][-1]
    if capabilities is None:
        debugger.pop("securityContext", None)
    else:
        debugger["securityContext"] = {"capabilities": capabilities}
    return body  # type: ignore[no-any-return]


DEBUG = {
    # kubectl debug --profile=general as recorded: SYS_PTRACE only
    "recorded-sys-ptrace-allowed": ({"add": ["SYS_PTRACE"]}, True),
    "custom-profile-sys-admin": ({"add": ["SYS_ADMIN"]}, False),
    "custom-profile-cap-sys-admin-lowercase": ({"add": ["cap_sys_admin"]}, False),
    "custom-profile-all": ({"add": ["ALL"]}, False),
    "drop-all-allowed": ({"drop": ["ALL"]}, True),
}


@pytest.mark.parametrize("name", list(DEBUG))
def test_kubectl_debug_recorded_review(client: Client, name: str) -> None:
    capabilities, allowed = DEBUG[name]
    body = _debug_review(capabilities)
    assert body["request"]["subResource"] == "ephemeralcontainers" and body["request"]["operation"] == "UPDATE"
    offline = admission_decide.review(Policy(_policy()), parse_review(body), Endpoint.VALIDATE)
    live = _live(client)("/validate", body)
    for allowed_now, message in ((offline.allowed, offline.message), (live["allowed"], live.get("status", {})
                                                                       .get("message", ""))):
        assert allowed_now is allowed, message
        if not allowed:
            assert message.startswith('GPU003 ephemeralContainer "dbg" adds capability'), message
            assert message.endswith("(spec.ephemeralContainers[0].securityContext.capabilities.add[0])")


# ---- 6. a pod pinned with spec.nodeName is judged against its node's config ---------------------------------


def _pinned(node: str, gpus: int = 2) -> dict[str, Any]:
    return make_pod([container("main", gpu=gpus)], nodeName=node)


def _fake() -> FakeKube:
    fake = FakeKube()
    fake.nodes["mps-node"] = {LABEL: "mps-bare"}
    fake.nodes["plain-node"] = {}
    fake.namespaces["gpu-demo"] = {}
    return fake


@pytest.mark.parametrize(("node", "allowed"), [("mps-node", False), ("plain-node", True)])
def test_node_name_pods_use_their_nodes_config_with_lookups(node: str, allowed: bool) -> None:
    policy = Policy(_policy(), facts=ApiFacts(_fake()))
    decision = admission_decide.review(policy, parse_review(review(_pinned(node))), Endpoint.VALIDATE)
    assert decision.allowed is allowed, decision.message
    if not allowed:
        assert "GPU004" in decision.message and "mps-bare" in decision.message


def test_node_name_offline_keeps_judging_every_config() -> None:
    # offline (check, lookups off): a split verdict over all configs is a warning, as before
    decision = admission_decide.review(Policy(_policy()), parse_review(review(_pinned("mps-node"))), Endpoint.VALIDATE)
    assert decision.allowed is True
    assert any("GPU004" in w for w in decision.warnings)


def test_node_name_live_with_lookups_over_tls(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "apiserver-pki")
    fake = _fake()
    with fake_apiserver(fake, pki) as url:
        config = tmp_path / "kubeconfig"
        config.write_text(yaml.safe_dump(kubeconfig(url, pki)), encoding="utf-8")
        with running_server(tmp_path / "webhook", POLICY,
                            extra_args=["--cluster-lookups", "--kubeconfig", str(config)]) as srv:
            c = srv.client()
            try:
                denied, _ = _decide_both(_pinned("mps-node"), _live(c))
                allowed, _ = _decide_both(_pinned("plain-node"), _live(c))
            finally:
                c.close()
    assert denied["allowed"] is False and "GPU004" in denied["status"]["message"]
    assert allowed["allowed"] is True
    assert ("read_node", ("mps-node",)) in fake.calls


# ---- 5. oversized reviews: what the API server legitimately sends is judged, a real 413 above it ------------


def _padded_pod(pad_bytes: int) -> dict[str, Any]:
    # 540 KB of "<" in an annotation: Go's encoder writes each as \u003c, six bytes
    pod = make_pod([container("main", gpu=1), caps(add=["SYS_ADMIN"])])
    pod["metadata"]["annotations"] = {"example.com/notes": "<" * pad_bytes}
    return pod


def _go_escaped(body: dict[str, Any]) -> bytes:
    return json.dumps(body).replace("<", "\\u003c").encode()


def test_a_large_update_review_is_judged_not_refused(server: Server) -> None:
    pod = _padded_pod(540_000)
    body = review(pod, operation="UPDATE", old=pod)
    raw = _go_escaped(body)
    assert len(raw) > 6_000_000  # object and oldObject, each ~3.2 MB once escaped
    client = server.client()
    try:
        reply = client.request("POST", "/validate", raw, headers={"Content-Type": "application/json"})
    finally:
        client.close()
    assert reply.status == 200, reply.body[:200]
    assert reply.json["response"]["allowed"] is True  # an unchanged pod: nothing new to deny


def test_a_large_create_review_is_judged_and_denied(server: Server) -> None:
    raw = _go_escaped(review(_padded_pod(540_000)))
    assert len(raw) > 3 * 1024 * 1024  # above the old 3 MiB limit
    client = server.client()
    try:
        reply = client.request("POST", "/validate", raw, headers={"Content-Type": "application/json"})
    finally:
        client.close()
    assert reply.status == 200
    assert "GPU003" in reply.json["response"]["status"]["message"]


def test_above_the_limit_is_a_real_413(server: Server) -> None:
    # the apiserver announces its body's length: the answer comes before a byte of it is read
    limit = _policy().max_request_bytes
    client = server.client()
    conn = client.new_connection()
    try:
        conn.putrequest("POST", "/validate")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(limit + 1))
        conn.endheaders()
        reply = conn.getresponse()
        status, payload = reply.status, json.loads(reply.read())
    finally:
        conn.close()
        client.close()
    assert status == 413
    assert payload == {"error": f"request body is larger than {limit} bytes"}


def test_node_name_of_an_unknown_node_falls_back_to_every_config() -> None:
    fake = _fake()
    policy = Policy(_policy(), facts=ApiFacts(fake))
    decision = admission_decide.review(policy, parse_review(review(_pinned("no-such-node"))), Endpoint.VALIDATE)
    assert decision.allowed is True and any("GPU004" in w for w in decision.warnings)
    assert ("read_node", ("no-such-node",)) in fake.calls


def test_node_without_the_label_uses_the_default_config() -> None:
    policy = Policy(make_config({**POLICY, "sharing": {**POLICY["sharing"], "defaultConfig": "mps-bare"}}),
                    facts=ApiFacts(_fake()))
    decision = admission_decide.review(policy, parse_review(review(_pinned("plain-node"))), Endpoint.VALIDATE)
    assert decision.allowed is False and "mps-bare" in decision.message
