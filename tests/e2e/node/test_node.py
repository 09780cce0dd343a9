"""The node harness itself (gpu_stack_dev.node), where a user of `make e2e` meets it: a node that cannot come up
fails with the last lines of the kubelet's and containerd's logs, and leaves no process behind."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from gpu_stack_dev import node


def test_a_node_whose_kubelet_dies_fails_with_its_log_and_stops_everything(real_node: node.Node,
                                                                            tmp_path: Path) -> None:
    assets = tmp_path / "assets"
    assets.mkdir()
    kubelet = assets / "kubelet"
    kubelet.write_text("#!/bin/sh\necho 'E1126 run.go:72] \"command failed\" err=\"failed to run Kubelet: stand-in\"'\n"
                       "exit 1\n")
    kubelet.chmod(0o755)
    shutil.copy(real_node.assets / "kube-proxy", assets / "kube-proxy")
    broken = node.Node(real_node.cluster, name="broken", assets=assets)
    with pytest.raises(node.NodeError) as failed:
        broken.start()
    message = str(failed.value)
    assert message.startswith("node broken: kubelet exited")
    assert "--- last lines of kubelet's log:" in message
    assert 'failed to run Kubelet: stand-in' in message
    assert "--- last lines of containerd's log:" in message
    assert all(p.poll() is not None for p in broken.procs.values()) and not broken.procs
    assert [pid for pid in node._pids_mentioning(str(broken.dir)) if pid != os.getpid()] == []
