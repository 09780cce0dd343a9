"""`make demo` on a real control plane: hack/demo.py given this session's cluster (as an existing cluster)
installs the chart, runs real kubectl against the live webhook, and removes what it made."""

from __future__ import annotations

import subprocess
import sys

from gpu_stack_dev.e2e.e2elib import ROOT, E2ECluster

GPU002 = ('Error from server (Forbidden): error when creating '
          '"hack/demo/manifests/10-bad-nvidia-visible-devices.yaml": admission webhook "validate.gpu-stack.io" '
          'denied the request: GPU002 container "main" sets '
          "NVIDIA_VISIBLE_DEVICES explicitly; GPUs are assigned by the device plugin, request nvidia.com/gpu instead "
          "(spec.containers[0].env[0])")


def test_demo_uses_the_control_plane(cluster: E2ECluster) -> None:
    env = {**cluster.env, "GPU_STACK_E2E_CLUSTER": "existing", "KUBECONFIG": str(cluster.kubeconfig)}
    proc = subprocess.run([sys.executable, "hack/demo.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == (f"gpu-stack demo on the existing cluster of KUBECONFIG={cluster.kubeconfig} "
                        "(GPU_STACK_E2E_CLUSTER=existing)")
    assert "STATUS: deployed" in lines
    assert GPU002 in lines
    # warnings from the mutating webhook, then kubectl's own line
    mps = lines.index("== kubectl apply -f 03-nvidia-mps-pod.yaml")
    assert lines[mps + 4:mps + 8] == [
        "Warning: gpu-stack GPU006: hostIPC=true for MPS (selects nvidia.com/device-plugin.config=mps-x10); "
        "off: mps.injectHostIPC",
        "Warning: gpu-stack GPU006: added MPS toleration gpu-stack.io/mps (selects "
        "nvidia.com/device-plugin.config=mps-x10)",
        "Warning: gpu-stack GPU008: set runtimeClassName nvidia: GPU pods run under the NVIDIA runtime",
        "pod/mps-nbody created",
    ]
    # read back from the API server
    assert 'true {"effect":"NoSchedule","key":"gpu-stack.io/mps","operator":"Exists"}' in lines
    assert '{"limits":{"nvidia.com/gpu":"1"},"requests":{"nvidia.com/gpu":"1"}}' in lines
    assert "== 8 objects created, 8 refused; removing the release, namespaces and webhook" in lines
    # torn down: no release, no webhook configuration of the demo left to judge anyone's pods
    assert "gpu-stack-demo" not in cluster.helm("list", "-A", "-q").stdout
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        assert not cluster.get_json(kind, "-l", "app.kubernetes.io/instance=gpu-stack-demo")["items"]
    namespaces = cluster.get_json("namespaces")["items"]
    left = [ns["metadata"]["name"] for ns in namespaces
            if ns["metadata"]["name"].startswith(("gpu-demo-", "gpu-stack-demo-"))
            and ns["status"]["phase"] != "Terminating"]
    assert not left
