#!/usr/bin/env bash
# hack/fresh-host.sh CMD [ARG...]: CMD where the machine's paths a run touches (the kubelet's, containerd's, CDI's,
# NVIDIA's: gpu_stack_dev.netns.HOST_PATHS) are as on a fresh machine, in a mount namespace of its own
# (gpu_stack_dev.netns.fresh says how). .ci/run runs the suites so. Runs on the machine's python3, before any
# venv exists: the module is the standard library only. Needs root.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if [[ -v PYTHONPATH ]]; then restore=(env "PYTHONPATH=$PYTHONPATH"); else restore=(env -u PYTHONPATH); fi
PYTHONPATH="$root/dev/src" exec python3 -m gpu_stack_dev.netns fresh -- "${restore[@]}" "$@"
