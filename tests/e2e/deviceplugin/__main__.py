"""Run the stand-in device plugin for one node of a chart render, until SIGTERM/SIGINT.

    python -m tests.e2e.deviceplugin --render render.yaml --node node1 --gpus 4 [--model Tesla-T4]
        [--config time-slicing] [--mig-config all-1g.10gb] --plugin-dir <kubelet root>/device-plugins
        [--no-device-specs] [--gpu-seed SEED]

render.yaml is `helm template` output of the release the node belongs to. --no-device-specs leaves out
the /dev/nvidia* device nodes a passDeviceSpecs config would hand over (a node without them cannot start
the container). --gpu-seed: made-up GPU UUIDs from this seed instead of the node name (GPUs the kubelet has
not seen before; its old ones may still be held by pods it is cleaning up). Prints one JSON line with the
resources and device IDs once registered.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import threading
from pathlib import Path

import yaml
from gpu_stack_dev.e2e.fleet import ChartSharing, NodeSpec

from .model import mps_root_of, node_plugin
from .server import StandInPlugin


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--render", type=Path, required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--model", default="Tesla-T4")
    parser.add_argument("--config", default=None)
    parser.add_argument("--mig-config", default=None)
    parser.add_argument("--plugin-dir", type=Path, required=True)
    parser.add_argument("--no-device-specs", action="store_true")
    parser.add_argument("--gpu-seed", default=None)
    args = parser.parse_args(argv)
    objects = [d for d in yaml.safe_load_all(args.render.read_text(encoding="utf-8")) if d]
    spec = NodeSpec(args.node, gpus=args.gpus, model=args.model, config=args.config, mig_config=args.mig_config)
    plugin = node_plugin(spec, ChartSharing.from_objects(objects), mps_root=mps_root_of(objects),
                         gpu_seed=args.gpu_seed)
    if args.no_device_specs:
        plugin = dataclasses.replace(plugin, pass_device_specs=False)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    with StandInPlugin(plugin, args.plugin_dir):
        print(json.dumps({r.name: [d.id for d in r.devices] for r in plugin.resources}), flush=True)
        done.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
