#!/usr/bin/env bash
# Make checkov (the Kubernetes security scanner `make lint` runs on the rendered chart) available in its own
# tool venv under .tools/checkov and print the path of its binary. Kept out of the test venv: checkov pulls
# in ~100 packages (boto3, aiohttp, networkx, ...) that the webhook and its tests must not depend on.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
tools="${GPU_STACK_TOOLS:-$root/.tools}"
python="${PYTHON:-python3}"
version="3.3.30"
venv="$tools/checkov"

if [[ ! -x "$venv/bin/checkov" ]] || [[ "$("$venv/bin/checkov" --version 2>/dev/null)" != "$version" ]]; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
  "$venv/bin/python" -m pip install --quiet "checkov==$version" >&2
fi
echo "$venv/bin/checkov"
