"""The `make bench` tooling is correct (no timing here): the request mix is made of valid AdmissionReviews
that the webhook answers as the bench expects, the baseline answers them too, the manifest format is
what bench/mix.lua reads."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import yaml
from gpu_stack_dev.bench import baseline_app, bodies, servers
from gpu_stack_dev.paths import BENCH
from gpu_stack_webhook.admission.review import parse_review
from gpu_stack_webhook.policy.config import PolicyConfig, parse_config
from gpu_stack_webhook.server.app import AppConfig, create_app

# The recordings are in the repository (tests/fixtures/README.md): absent, every test here fails.
assert bodies.FIXTURES.is_dir(), f"recorded fixtures absent at {bodies.FIXTURES}"


def _all_bodies() -> list[bodies.Body]:
    return [b for ep in bodies.ENDPOINTS for b in bodies.mix(ep)]


def test_the_mix_covers_the_five_cases_on_both_endpoints() -> None:
    for endpoint in bodies.ENDPOINTS:
        names = [b.name for b in bodies.mix(endpoint)]
        assert names == ["gpu-pod", "pod-10x50env", "mps-pod", "deployment", "denied-pod"]
        assert {b.path for b in bodies.mix(endpoint)} == {f"/{endpoint}"}
    uids = [b.uid for b in _all_bodies()]
    assert len(set(uids)) == len(uids)


def test_every_body_is_an_admission_review_the_webhook_answers_as_expected() -> None:
    client = create_app(AppConfig(policy=PolicyConfig())).test_client()
    for body in _all_bodies():
        request = parse_review(json.loads(body.data))
        assert request.uid == body.uid
        reply = client.post(body.path, data=body.data, content_type="application/json")
        assert reply.status_code == 200, (body.name, reply.data)
        response = reply.get_json()["response"]
        assert response["uid"] == body.uid
        assert response["allowed"] is body.allowed, (body.path, body.name, response)
        assert ("patch" in response) is body.patched, (body.path, body.name)
        if body.patched:
            ops = json.loads(base64.b64decode(response["patch"]))
            assert {"op": "add", "path": "/spec/hostIPC", "value": True} in ops


def test_the_big_pod_is_scaled_from_the_recording() -> None:
    for n in (1, 10, 200):
        review = bodies.scaled_pod("validate", n, env=50)
        containers = review["request"]["object"]["spec"]["containers"]
        assert len(containers) == n
        assert all(len(c["env"]) == 50 for c in containers)
        assert containers[0]["resources"]["limits"] == {bodies.GPU: "1"}
        # Everything else is the recorded request: the apiserver's envelope and defaulted fields.
        assert review["request"]["userInfo"]["username"] == "kubernetes-admin"


def test_the_baseline_allows_with_the_uid_echoed() -> None:
    for body in bodies.mix("validate"):
        environ: dict[str, Any] = {
            "REQUEST_METHOD": "POST", "CONTENT_LENGTH": str(len(body.data)), "wsgi.input": io.BytesIO(body.data),
        }
        seen: list[Any] = []
        out = b"".join(baseline_app.app(environ, lambda status, headers, seen=seen: seen.append((status, headers))))
        assert seen[0][0] == "200 OK"
        assert json.loads(out) == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "response": {"uid": body.uid, "allowed": True}}


def test_the_manifest_lists_path_and_file_per_body(tmp_path: Path) -> None:
    mix = bodies.mix("mutate")
    manifest = bodies.write_manifest(mix, tmp_path, "mutate")
    lines = manifest.read_text().splitlines()
    assert len(lines) == len(mix)
    for line, body in zip(lines, mix, strict=True):
        path, file = line.split("\t")
        assert path == "/mutate"
        assert Path(file).read_bytes() == body.data
    lua = (BENCH / "mix.lua").read_text()
    assert 'line:match("^(%S+)\\t(.+)$")' in lua


# --- the pod mix --------------------------------------------------------------------------------------

MIXES = {ep: bodies.pod_mix(ep) for ep in bodies.ENDPOINTS}
KIND = {s.name: s.kind for s in bodies.SHAPES}


def test_the_mix_is_thousands_of_distinct_bodies_of_at_least_50_shapes_in_the_stated_shares() -> None:
    for endpoint, mix in MIXES.items():
        assert len(mix) == bodies.MIX_BODIES >= 1000
        assert len({b.data for b in mix}) == len(mix), endpoint  # every body differs from every other
        assert len({b.name for b in mix}) == len(bodies.SHAPES) >= 50
        for kind, share in bodies.KIND_SHARE.items():
            assert sum(KIND[b.name] == kind for b in mix) == round(share * len(mix)), (endpoint, kind)
    # The shapes differ in the pod spec itself (containers, init containers, scheduling), not only in names.
    specs = {}
    for body in MIXES["validate"]:
        spec = body.review["request"]["object"]["spec"]
        specs.setdefault(body.name, json.dumps({k: spec.get(k) for k in (
            "containers", "initContainers", "nodeSelector", "tolerations")}, sort_keys=True))
    assert len(set(specs.values())) == len(bodies.SHAPES)
    # Both endpoints get the same shapes in the same order, and what the report says is what was counted.
    assert [b.name for b in MIXES["validate"]] == [b.name for b in MIXES["mutate"]]
    said = bodies.describe(MIXES["validate"], MIXES["mutate"])
    assert {k: v["share"] for k, v in said["by_kind"].items()} == bodies.KIND_SHARE
    assert sum(v["shapes"] for v in said["by_kind"].values()) == said["shapes"] == len(bodies.SHAPES)
    assert said["denied"] == sum(b.name in bodies.DENIED_SHAPES for b in MIXES["validate"]) > 0
    assert said["patched"] == sum(KIND[b.name] != "none" for b in MIXES["mutate"])
    assert 0.6 <= bodies.KIND_SHARE["none"] < 1  # most pods have no GPU


def test_uids_and_names_are_unique_per_body_and_per_send() -> None:
    for endpoint, mix in MIXES.items():
        uids = [b.uid for b in mix]
        assert len(set(uids)) == len(uids)
        assert all(uid.endswith(bodies.SERIAL_MARK) for uid in uids)
        validating = endpoint == "validate"
        names = [b.review["request"].get("name") for b in mix]
        if validating:  # the API server has generated the name by then
            assert len(set(names)) == len(names)
            assert all(n.startswith(b.review["request"]["object"]["metadata"]["generateName"])
                       for n, b in zip(names, mix, strict=True))
        else:  # /mutate sees generateName and no name yet, as from the API server
            assert set(names) == {None}
        # What mix.lua sends for a body: the marker replaced by the send's 12-digit serial, same length.
        body = mix[0]
        sends = [json.loads(bodies.stamp(body.data, serial)) for serial in (1, 2, 10**11)]
        assert len({s["request"]["uid"] for s in sends}) == 3
        assert {len(bodies.stamp(body.data, serial)) for serial in (1, 10**11)} == {len(body.data)}
        assert bodies.SERIAL_MARK.encode() not in bodies.stamp(body.data, 7)
        if validating:
            assert len({s["request"]["object"]["metadata"]["name"] for s in sends}) == 3
            assert sends[0]["request"]["name"] == sends[0]["request"]["object"]["metadata"]["name"]
    lua = (BENCH / "mix.lua").read_text()
    assert f'local SERIAL = "{bodies.SERIAL_MARK}"' in lua
    assert 'string.format("%02d%010d", (id or 1) % 100, serial % 10000000000)' in lua  # always 12 digits


def test_the_webhook_answers_every_body_of_the_mix_as_the_bench_expects() -> None:
    """With the policy the bench serves (the chart rendered for bodies.MIX_VALUES): GPU, MPS and MIG pods
    are patched on /mutate and none is denied but the denied shapes, on /validate, by their rule."""
    config = parse_config(yaml.safe_load(servers.chart_policy(bodies.MIX_VALUES)))
    client = create_app(AppConfig(policy=config)).test_client()
    denied_by: dict[str, set[str]] = {}
    for endpoint, mix in MIXES.items():
        for body in mix:
            data = bodies.stamp(body.data, 1)
            response = client.post(body.path, data=data, content_type="application/json").get_json()["response"]
            assert response["uid"] == json.loads(data)["request"]["uid"]
            assert response["allowed"] is body.allowed, (endpoint, body.name, response)
            assert ("patch" in response) is body.patched, (endpoint, body.name)
            if not body.allowed:
                denied_by.setdefault(body.name, set()).add(response["status"]["message"])
    assert set(denied_by) == set(bodies.DENIED_SHAPES)
    for name, messages in denied_by.items():
        assert all(bodies.DENIED_SHAPES[name] in message for message in messages), (name, messages)


def test_the_mix_manifest_lists_every_body_in_order(tmp_path: Path) -> None:
    for endpoint, mix in MIXES.items():
        manifest = bodies.write_manifest(mix, tmp_path, f"mix-{endpoint}")
        lines = manifest.read_text().splitlines()
        assert len(lines) == len(mix)
        for line, body in zip(lines, mix, strict=True):
            path, file = line.split("\t")
            assert path == f"/{endpoint}"
            assert Path(file).read_bytes() == body.data
