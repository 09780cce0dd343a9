"""GPU007 no-device-requests-outside-plugin: no CDI annotations, no mounts under /var/run/nvidia-container-devices.

The NVIDIA container toolkit reads the volume-mount device list as
`strings.HasPrefix(filepath.Clean(destination), "/var/run/nvidia-container-devices")` and takes what follows
as the device name, so every spelling it would clean into that prefix must be denied.
"""

from __future__ import annotations

import pytest
from gpu_stack_webhook.policy.findings import Severity

from .podlib import (
    ALL_KINDS,
    CONTAINER_KINDS,
    CONTAINER_LABEL,
    META_PATH,
    SPEC_PATH,
    WORKLOAD_KINDS,
    container,
    make_pod,
    pod_with,
    wrap,
)
from .policylib import config_default, decide, findings, only

RULE = "GPU007"
DIR = "/var/run/nvidia-container-devices"

# (mountPath, denied)
MOUNT_PATHS = [
    # the device list directory itself -> deny
    pytest.param(DIR, True, id="dir"),
    # a device entry GPU-<uuid> below it: hands that GPU to the container -> deny
    pytest.param(f"{DIR}/GPU-0d5b9c2e", True, id="device-uuid"),
    # "all" below it: every GPU -> deny
    pytest.param(f"{DIR}/all", True, id="device-all"),
    # trailing slash -> deny
    pytest.param(f"{DIR}/", True, id="trailing-slash"),
    # doubled slashes -> deny
    pytest.param("//var//run//nvidia-container-devices//0", True, id="double-slashes"),
    # "." components -> deny
    pytest.param("/var/run/./nvidia-container-devices/0", True, id="dot-component"),
    pytest.param("/var/./run/nvidia-container-devices/./0", True, id="dot-components"),
    # relative path (no leading slash) is taken from / -> deny
    pytest.param("var/run/nvidia-container-devices/0", True, id="relative"),
    # ".." that resolves back into the directory: the toolkit cleans it -> must deny
    pytest.param("/var/run/../run/nvidia-container-devices/all", True, id="dotdot-back-in"),
    pytest.param("/tmp/../var/run/nvidia-container-devices/0", True, id="dotdot-from-tmp"),
    # no "/" after the directory name: the toolkit's plain prefix match reads device "all" -> must deny
    pytest.param(f"{DIR}all", True, id="glued-all"),
    # ... or device "0"
    pytest.param(f"{DIR}0", True, id="glued-index"),
    # /run/... is a different destination string for the toolkit -> allowed
    pytest.param("/run/nvidia-container-devices/0", False, id="run-not-var-run"),
    # a parent directory is not the device list -> allowed
    pytest.param("/var/run", False, id="parent"),
    # a sibling name that is not a prefix match -> allowed
    pytest.param("/var/run/nvidia-container", False, id="shorter-sibling"),
    pytest.param("/var/run/nvidia-persistenced", False, id="other-nvidia-dir"),
    # an ordinary data mount -> allowed
    pytest.param("/data", False, id="plain"),
]


@pytest.mark.parametrize(("mount_path", "denied"), MOUNT_PATHS)
def test_device_list_mount_paths(mount_path: str, denied: bool) -> None:
    pod = make_pod([container("x", gpu=1, mounts=["/data", mount_path])])
    found = findings(pod, RULE)
    if not denied:
        assert found == []
        return
    f = only(found)
    assert (f.severity, f.path) == (Severity.DENY, "spec.containers[0].volumeMounts[1]")
    assert f.message == (f'container "x" mounts {mount_path}, which the NVIDIA runtime reads as a GPU device list; '
                         "mount it elsewhere")


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("field", CONTAINER_KINDS)
def test_mount_in_every_container_kind_and_workload(field: str, kind: str) -> None:
    # a device-list mount in any container (also a non-GPU one) of any workload -> deny at its volumeMounts path
    obj = wrap(pod_with(field, container("x", mounts=[f"{DIR}/all"])), kind)
    f = only(findings(obj, RULE, kind))
    assert (f.severity, f.path) == (Severity.DENY, f"{SPEC_PATH[kind]}.{field}[0].volumeMounts[0]")
    assert f.message.startswith(f'{CONTAINER_LABEL[field]} "x" mounts {DIR}/all')


# (annotation key, denied)
ANNOTATIONS = [
    # a CDI device request by annotation: containerd/CRI-O inject the GPU without the device plugin -> deny
    pytest.param("cdi.k8s.io/gpu", True, id="cdi-annotation"),
    # any name under the CDI prefix -> deny
    pytest.param("cdi.k8s.io/nvidia-gpu-all", True, id="cdi-annotation-other-name"),
    # the bare domain without a name is not a CDI device annotation -> allowed
    pytest.param("cdi.k8s.io", False, id="bare-domain"),
    # a subdomain is a different prefix -> allowed
    pytest.param("example.cdi.k8s.io/gpu", False, id="subdomain"),
    # unrelated annotation -> allowed
    pytest.param("gpu-stack.io/team", False, id="unrelated"),
]


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize(("key", "denied"), ANNOTATIONS)
def test_cdi_annotations(key: str, denied: bool, kind: str) -> None:
    # the annotation on the pod (or the workload's pod template metadata)
    obj = wrap(make_pod([container("x")], annotations={key: "nvidia.com/gpu=all"}), kind)
    found = findings(obj, RULE, kind)
    if not denied:
        assert found == []
        return
    f = only(found)
    assert (f.severity, f.path) == (Severity.DENY, f"{META_PATH[kind]}.annotations[{key}]")
    assert f.message == f'annotation "{key}" requests CDI devices directly; request nvidia.com/gpu instead'


@pytest.mark.parametrize("kind", WORKLOAD_KINDS)
def test_cdi_annotation_on_the_workload_itself_is_allowed(kind: str) -> None:
    # annotations of the Deployment object (not its template) never reach the pods -> allowed
    obj = wrap(make_pod([container("x")]), kind)
    obj["metadata"]["annotations"] = {"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}
    assert findings(obj, RULE, kind) == []


def test_all_violations_in_one_denial() -> None:
    # CDI annotation plus two mounts: /validate lists all three
    pod = make_pod([container("a", mounts=[f"{DIR}/0"]), container("b", mounts=[f"{DIR}/1"])],
                   annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"})
    decision = decide(pod, "validate")
    assert not decision.allowed and decision.code == 403
    assert decision.message.startswith("3 GPU policy violations: [1] GPU007 annotation")
    assert "(spec.containers[0].volumeMounts[0])" in decision.message
    assert "[3] GPU007 container \"b\"" in decision.message
    assert decide(pod, "mutate").allowed  # Kubernetes accepts all of it: only /validate denies


def test_disabled_rule_reports_nothing() -> None:
    # GPU007 disabled: device-list mounts and CDI annotations pass
    pod = make_pod([container("a", mounts=[f"{DIR}/0"])], annotations={"cdi.k8s.io/gpu": "x"})
    config = config_default(rules={"disabled": ["GPU007"]})
    assert findings(pod, RULE, config=config) == []
    assert decide(pod, "validate", config).allowed
