"""The `make bench` tooling is correct (no timing here): the request mix is made of valid AdmissionReviews
that the webhook answers as the bench expects, the baseline answers them too, the manifest format is
what bench/mix.lua reads."""

from __future__ import annotations

import base64
import io
import json
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import baseline_app  # noqa: E402
import bodies  # noqa: E402
from gpu_stack_webhook.admission.review import parse_review  # noqa: E402
from gpu_stack_webhook.policy.config import PolicyConfig  # noqa: E402
from gpu_stack_webhook.server.app import AppConfig, create_app  # noqa: E402

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
