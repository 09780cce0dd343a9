#!/usr/bin/env bash
# A stand-in for webhook/Dockerfile's base image (python:3.11-slim-bookworm) made from Debian packages, for
# machines that reach Debian's archive but no container registry. It is used only through the Dockerfile's
# build argument (make image PYTHON_IMAGE=...); the Dockerfile itself is the one users build.
#
#   hack/image/standin-base.sh [IMAGE]   (default localhost/gpu-stack-python-standin:3.11-bookworm)
#
# What the Dockerfile needs of its base, and what provides it here (Debian bookworm ships Python 3.11, the
# version of the real base and of the /opt/venv/lib/python3.11 paths in the Dockerfile):
#   python, python -m venv, pip in a venv   python3, python-is-python3, python3-venv
#   Python.h for mypyc's build stage        python3-dev (no compiler: the Dockerfile installs gcc itself)
#   apt-get for that install                minbase's apt, with this machine's own apt sources
#   TLS to the package index                ca-certificates
# mmdebstrap builds the root filesystem without root-only tricks (~20 s); buildah turns it into an image.
# Idempotent: an existing IMAGE is kept unless STANDIN_REBUILD=1.
set -euo pipefail

image="${1:-localhost/gpu-stack-python-standin:3.11-bookworm}"
if [[ "${STANDIN_REBUILD:-0}" != 1 ]] && buildah inspect --type image "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi
for tool in mmdebstrap buildah; do
  command -v "$tool" >/dev/null || { echo "standin-base: $tool not found (apt-get install $tool)" >&2; exit 1; }
done
sources=""
for candidate in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
  [[ -s "$candidate" ]] && { sources="$candidate"; break; }
done
[[ -n "$sources" ]] || { echo "standin-base: no apt sources on this machine to build from" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mmdebstrap --quiet --variant=minbase \
  --include=python3,python-is-python3,python3-venv,python3-dev,ca-certificates \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
  bookworm "$work/rootfs.tar" - <"$sources" >&2
printf 'FROM scratch\nADD rootfs.tar /\nENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8\nCMD ["python3"]\n' \
  >"$work/Containerfile"
buildah bud --quiet --isolation chroot --layers=false -f "$work/Containerfile" -t "$image" "$work" >&2
echo "$image"
