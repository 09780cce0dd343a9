#!/usr/bin/env bash
# Install what a real node (gpu_stack_dev.node) and the image builds of `make e2e` need, from Debian's packages:
#   containerd (1.6)               the container runtime the kubelet talks to (CRI)
#   runsc                          gVisor: runs every pod here (runc and crun cannot start containers here)
#   containernetworking-plugins    the CNI bridge, host-local, loopback and portmap plugins (/usr/lib/cni)
#   iptables                       kube-proxy's Service rules
#   busybox-static, bash-static    the pause, test and kubectl images (hack/image/node-images.sh)
#   buildah, mmdebstrap            the webhook image from webhook/Dockerfile and its stand-in base
#                                  (hack/build-image.sh, hack/image/standin-base.sh)
#   docker-registry, skopeo,       the TLS registry with htpasswd auth the node pulls released images from,
#   apache2-utils (htpasswd)       and what pushes to it (gpu_stack_dev.registry)
# Nothing is started. Idempotent: when every tool is there, nothing is installed. Needs root and apt-get.
# With arguments, only those tools (as named below), e.g. `hack/ensure-node.sh buildah /bin/busybox`, what
# `make test`'s image-build tests need.
set -euo pipefail

declare -A package_of=([containerd]=containerd [runsc]=runsc [/usr/lib/cni/bridge]=containernetworking-plugins
  [iptables]=iptables [/bin/busybox]=busybox-static [/bin/bash-static]=bash-static [buildah]=buildah [mmdebstrap]=mmdebstrap
  [docker-registry]=docker-registry [skopeo]=skopeo [htpasswd]=apache2-utils)
missing=()
tools=("$@")
((${#tools[@]})) || tools=("${!package_of[@]}")
for tool in "${tools[@]}"; do
  [[ -n "${package_of[$tool]:-}" ]] || { echo "$0: no package known for $tool" >&2; exit 2; }
  if [[ "$tool" == /* ]]; then [[ -x "$tool" ]] && continue; else command -v "$tool" >/dev/null 2>&1 && continue; fi
  missing+=("${package_of[$tool]}")
done
((${#missing[@]} == 0)) && exit 0
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "$0: missing ${missing[*]}: install them (apt-get install ${missing[*]})" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq "${missing[@]}" >&2; then
  apt-get update -qq >&2
  apt-get install -y -qq "${missing[@]}" >&2
fi
