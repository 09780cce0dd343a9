"""Properties for the side doors to GPUs (tests/webhook/test_side_doors.py): capability spellings,
resource-name spellings, review sizes.

Each holds through the HTTP layer (Flask test client over create_app): never an HTTP 5xx and never an
in-band internal error, and the verdict follows the documented rule whatever the spelling.
"""

from __future__ import annotations

import io
import json
from functools import cache
from typing import Any

from flask.testing import FlaskClient
from gpu_stack_webhook.policy.config import parse_config
from gpu_stack_webhook.server.app import AppConfig, create_app
from hypothesis import given
from hypothesis import strategies as st

from . import counting
from .strategies import review_body
from .test_properties import check_answer

GPU = "nvidia.com/gpu"
SIZE_LIMIT = 64 * 1024


@cache
def _client(policy_json: str) -> FlaskClient:
    return create_app(AppConfig(policy=parse_config(json.loads(policy_json), "property"))).test_client()


def _post(policy: dict[str, Any], path: str, data: bytes) -> tuple[int, Any]:
    reply = _client(json.dumps(policy, sort_keys=True)).post(path, data=data, content_type="application/json")
    assert reply.status_code < 500, reply.data[:300]
    return reply.status_code, json.loads(reply.data)


def _pod(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team"},
            "spec": {"containers": list(containers), **spec}}


def _gpu_main(count: int = 1) -> dict[str, Any]:
    return {"name": "main", "image": "cuda", "resources": {"requests": {GPU: count}, "limits": {GPU: count}}}


# --- capability spellings -----------------------------------------------------------------------------


def _respell(word: str, flags: list[bool]) -> str:
    return "".join(c.upper() if up else c.lower() for c, up in zip(word, flags + [False] * len(word), strict=False))


@st.composite
def capability_spellings(draw: st.DrawFn) -> tuple[Any, bool]:
    """(a capabilities.add entry, whether it grants CAP_SYS_ADMIN)."""
    kind = draw(st.sampled_from(("sys_admin", "all", "other", "junk")))
    if kind == "junk":
        return draw(st.one_of(st.none(), st.integers(), st.text(max_size=12), st.lists(st.text(max_size=3)))), False
    word = {"sys_admin": "sys_admin", "all": "all"}.get(kind) or draw(
        st.sampled_from(("net_admin", "net_raw", "sys_ptrace", "sys_adm", "sys_admin2", "allx", "chown")))
    flags = draw(st.lists(st.booleans(), min_size=len(word), max_size=len(word)))
    prefix = draw(st.sampled_from(("", "CAP_", "cap_", "Cap_")))
    pad = draw(st.sampled_from(("", " ", "\t")))
    spelled = f"{pad}{prefix}{_respell(word, flags)}{pad}"
    return spelled, kind in ("sys_admin", "all")


@given(entry=capability_spellings(), own_gpu=st.booleans(), field=st.sampled_from(("containers", "initContainers")))
def test_capability_spellings_are_judged_by_what_the_runtime_reads(entry: tuple[Any, bool], own_gpu: bool,
                                                                    field: str) -> None:
    counting.tick()
    spelling, grants = entry
    side: dict[str, Any] = {"name": "side", "image": "busybox",
                            "securityContext": {"capabilities": {"add": [spelling]}}}
    if own_gpu:
        side["resources"] = {"requests": {GPU: 1}, "limits": {GPU: 1}}
    pod = _pod(_gpu_main(), **({"initContainers": [side]} if field == "initContainers" else {}))
    if field == "containers":
        pod["spec"]["containers"].append(side)
    body = review_body(pod)
    status, answer = _post({}, "/validate", json.dumps(body).encode())
    response = check_answer(status, answer, body, allow_internal_error=False)
    assert response is not None
    denied_by_gpu003 = not response["allowed"] and "GPU003" in response["status"]["message"]
    assert denied_by_gpu003 is (grants and not own_gpu), (spelling, response.get("status"))


# --- resource-name spellings ----------------------------------------------------------------------------

NAME_SPELLINGS = ("gpu", "nvidia.com/gpu", "GPU", "nvidia.com/GPU", "gpu.shared", "nvidia.com/gpu.shared",
                  "mig-1g.5gb", "nvidia.com/mig-1g.5gb", "rdma_shared_device_a", "nvidia.com/rdma_shared_device_a",
                  "nvidia.com/hostdev", "example.com/gpu", "nvidia.com/", "")


@given(config_name=st.sampled_from(NAME_SPELLINGS[:4]), mps=st.booleans(), rename=st.booleans(),
       requested=st.sampled_from(NAME_SPELLINGS), count=st.integers(0, 3), privileged=st.booleans())
def test_resource_name_spellings_never_crash_and_bare_names_mean_prefixed(
        config_name: str, mps: bool, rename: bool, requested: str, count: int, privileged: bool) -> None:
    counting.tick()
    section: dict[str, Any] = {"resources": [{"name": config_name, "replicas": 4}]}
    if not mps:
        section |= {"renameByDefault": rename, "failRequestsGreaterThanOne": True}
    def policy(name: str) -> dict[str, Any]:
        sec = json.loads(json.dumps(section))
        sec["resources"][0]["name"] = name
        return {"sharing": {"configs": {"default": {"version": "v1", "flags": {"migStrategy": "mixed"},
                                                    "sharing": {"mps" if mps else "timeSlicing": sec}}}}}
    c: dict[str, Any] = {"name": "main", "image": "cuda"}
    if requested:
        c["resources"] = {"requests": {requested: count}, "limits": {requested: count}}
    if privileged:
        c["securityContext"] = {"privileged": True}
    body = review_body(_pod(c))
    data = json.dumps(body).encode()
    answers = []
    for spelled in {config_name, config_name if config_name.startswith("nvidia.com/") else f"nvidia.com/{config_name}"}:
        for path in ("/mutate", "/validate"):
            status, answer = _post(policy(spelled), path, data)
            response = check_answer(status, answer, body, allow_internal_error=False)
            assert response is not None
            answers.append((spelled, path, response["allowed"], response.get("status", {}).get("message")))
    # the bare spelling and the prefixed one get the same verdicts (the device plugin prefixes bare names)
    verdicts = {(path, allowed, message) for _, path, allowed, message in answers}
    assert len(verdicts) == len({a[1] for a in answers}), answers


# --- review sizes -------------------------------------------------------------------------------------------


@given(pad=st.integers(0, 2 * SIZE_LIMIT // 6), char=st.sampled_from(("<", ">", "&", "a", "\u2028", "\x01")),
       update=st.booleans(), chunked=st.booleans(), endpoint=st.sampled_from(("/mutate", "/validate")))
def test_review_sizes_are_judged_up_to_the_limit_and_413_above(pad: int, char: str, update: bool, chunked: bool,
                                                               endpoint: str) -> None:
    counting.tick()
    pod = _pod(_gpu_main())
    pod["metadata"]["annotations"] = {"example.com/pad": char * pad}
    body = review_body(pod, operation="UPDATE", old=pod) if update else review_body(pod)
    # as Go's encoder writes it: <, >, & and U+2028 as six-byte escapes
    data = (json.dumps(body).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").encode())
    policy = {"maxRequestBytes": SIZE_LIMIT}
    client = _client(json.dumps(policy, sort_keys=True))
    if chunked:
        # no Content-Length; gunicorn marks such a stream as ending with the body (wsgi.input_terminated)
        reply = client.post(endpoint, input_stream=io.BytesIO(data), content_type="application/json",
                            headers={"Transfer-Encoding": "chunked"},
                            environ_overrides={"wsgi.input_terminated": True})
    else:
        reply = client.post(endpoint, data=data, content_type="application/json")
    assert reply.status_code < 500, reply.data[:300]
    answer = json.loads(reply.data)
    if len(data) > SIZE_LIMIT:
        assert reply.status_code == 413 and answer == {"error": f"request body is larger than {SIZE_LIMIT} bytes"}
    else:
        response = check_answer(reply.status_code, answer, body, allow_internal_error=False)
        assert response is not None and response["allowed"] is True
