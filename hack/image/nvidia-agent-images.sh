#!/usr/bin/env bash
# The NVIDIA node agents' images, with the upstream layout, from the binaries in ../shared/gpu-node (built
# from the upstream tags there; unpacked with its unpack.sh, never downloaded) on a base made from Debian
# packages in the place of NVIDIA's distroless bases (no registry serves them here):
#   base     libc6 + ca-certificates (mmdebstrap --variant=extract), busybox in /busybox and /bin/sh -> /busybox/sh,
#            root and nonroot (65532) in /etc/passwd: what nvcr.io/nvidia/distroless/go + busybox give the binaries
#   DIR/k8s-device-plugin.tar  REF_DEVICE_PLUGIN   k8s-device-plugin v0.20.0 deployments/container/Dockerfile:
#            /usr/bin/{config-manager,gpu-feature-discovery,mps-control-daemon,nvidia-device-plugin}
#   DIR/container-toolkit.tar  REF_TOOLKIT         nvidia-container-toolkit v1.20.0 deployments/container/Dockerfile
#            (application): /work/nvidia-ctk-installer (+ /work/nvidia-toolkit), the toolkit binaries under
#            /artifacts/deb/usr/bin. Five files the installer requires are not built here, so each is a
#            stand-in that fails loudly if anything loads or runs it (toolkit_standins below): libnvidia-container.so.1,
#            libnvidia-container-go.so.1 and nvidia-container-cli (NVIDIA/libnvidia-container, C), and
#            nvidia-container-runtime.{cdi,legacy} (Go commands of the toolkit that ../shared/gpu-node did not build)
#   DIR/k8s-mig-manager.tar    REF_MIG_MANAGER     mig-parted v0.15.0 deployments/container/Dockerfile:
#            /usr/bin/{nvidia-mig-parted,nvidia-mig-manager,nvidia-ctk}, /var/run -> /run
#   DIR/dra-driver.tar         REF_DRA             dra-driver-nvidia-gpu v0.4.1 (the newest release; the chart's
#            tag names v0.5.0): /usr/bin/{gpu-kubelet-plugin,nvidia-cdi-hook}, /bin/bash
#
#   REF_DEVICE_PLUGIN=... REF_TOOLKIT=... REF_MIG_MANAGER=... REF_DRA=... hack/image/nvidia-agent-images.sh DIR [GPU_NODE]
#
# The refs are the image names and tags the chart renders (gpu_stack_dev.e2e.agent_images passes them).
# Archives are docker-archive tarballs for `ctr images import`; an existing archive is kept.
set -euo pipefail
out="${1:?usage: nvidia-agent-images.sh DIR [GPU_NODE]}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
src="${2:-${GPU_STACK_GPU_NODE_SRC:-$root/../shared/gpu-node}}"
[[ -x "$src/unpack.sh" ]] || src="$(cd "$root/../.." && pwd)/shared/gpu-node"  # a git worktree under wt/
[[ -x "$src/unpack.sh" ]] || { echo "nvidia-agent-images: no gpu-node folder with unpack.sh (${2:-../shared/gpu-node})" >&2; exit 1; }
for tool in mmdebstrap buildah; do
  command -v "$tool" >/dev/null || { echo "nvidia-agent-images: $tool not found (hack/ensure-node.sh)" >&2; exit 1; }
done
: "${REF_DEVICE_PLUGIN:?}" "${REF_TOOLKIT:?}" "${REF_MIG_MANAGER:?}" "${REF_DRA:?}"
mkdir -p "$out"
wanted=()
for archive in k8s-device-plugin container-toolkit k8s-mig-manager dra-driver; do
  [[ -s "$out/$archive.tar" ]] || wanted+=("$archive")
done
((${#wanted[@]} == 0)) && exit 0

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$src/unpack.sh" "$work/bin" >/dev/null

base=localhost/gpu-stack-nvidia-agent-base:bookworm
if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  sources=""
  for candidate in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
    [[ -s "$candidate" ]] && { sources="$candidate"; break; }
  done
  [[ -n "$sources" ]] || { echo "nvidia-agent-images: no apt sources on this machine to build from" >&2; exit 1; }
  mkdir -p "$work/base"
  mmdebstrap --quiet --variant=extract --include=libc6,libgcc-s1,ca-certificates bookworm "$work/base/rootfs.tar" - \
    <"$sources" >&2
  cp /bin/busybox "$work/base/busybox"
  printf 'root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$work/base/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$work/base/group"
  cat >"$work/base/Containerfile" <<'EOF'
FROM scratch
ADD rootfs.tar /
COPY busybox /busybox/busybox
COPY passwd group /etc/
RUN ["/busybox/busybox", "--install", "/busybox"]
RUN ["/busybox/sh", "-c", "/busybox/mkdir -p /bin /tmp /run && /busybox/rm -f /bin/sh && /busybox/ln -s /busybox/sh /bin/sh"]
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/busybox
EOF
  buildah bud --quiet --isolation chroot --layers=false -f "$work/base/Containerfile" -t "$base" "$work/base" >/dev/null
fi

build() { # archive ref, Containerfile on stdin (its context is the unpacked binaries)
  local archive="$1" ref="$2"
  [[ -s "$out/$archive.tar" ]] && { cat >/dev/null; return 0; }
  cat >"$work/bin/Containerfile"
  buildah bud --quiet --isolation chroot --layers=false -f "$work/bin/Containerfile" -t "$ref" "$work/bin" >/dev/null
  buildah push --quiet "$ref" "docker-archive:$out/$archive.tar.part:$ref" >/dev/null
  mv "$out/$archive.tar.part" "$out/$archive.tar"
  echo "$ref" >&2
}

build k8s-device-plugin "$REF_DEVICE_PLUGIN" <<EOF
FROM $base
USER 0:0
ENV NVIDIA_DISABLE_REQUIRE=true NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
COPY config-manager gpu-feature-discovery mps-control-daemon nvidia-device-plugin /usr/bin/
ENTRYPOINT ["nvidia-device-plugin"]
EOF

toolkit_standins() { # the files nvidia-ctk-installer v1.20.0 requires that are not built here (see the header)
  local lib cmd
  mkdir -p "$work/bin/standin-lib" "$work/bin/standin-bin"
  for lib in libnvidia-container.so.1 libnvidia-container-go.so.1; do
    printf 'gpu-stack stand-in for %s (NVIDIA/libnvidia-container, not built here): not a library\n' "$lib" \
      >"$work/bin/standin-lib/$lib"
  done
  for cmd in nvidia-container-cli nvidia-container-runtime.cdi nvidia-container-runtime.legacy; do
    printf '#!/bin/sh\necho "gpu-stack stand-in for %s: not built here" >&2\nexit 1\n' "$cmd" >"$work/bin/standin-bin/$cmd"
    chmod 755 "$work/bin/standin-bin/$cmd"
  done
}
[[ -s "$out/container-toolkit.tar" ]] || toolkit_standins
build container-toolkit "$REF_TOOLKIT" <<EOF
FROM $base
WORKDIR /work
COPY nvidia-ctk-installer /work/nvidia-ctk-installer
RUN ["/busybox/ln", "-s", "nvidia-ctk-installer", "/work/nvidia-toolkit"]
COPY nvidia-ctk nvidia-cdi-hook nvidia-container-runtime nvidia-container-runtime-hook /artifacts/deb/usr/bin/
COPY standin-bin/ /artifacts/deb/usr/bin/
COPY standin-lib/ /artifacts/deb/usr/lib/x86_64-linux-gnu/
ENV PATH=/work:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/busybox
ENV NVIDIA_DISABLE_REQUIRE=true NVIDIA_VISIBLE_DEVICES=void NVIDIA_DRIVER_CAPABILITIES=utility
ENTRYPOINT ["/work/nvidia-ctk-installer"]
EOF

build k8s-mig-manager "$REF_MIG_MANAGER" <<EOF
FROM $base
COPY nvidia-mig-parted nvidia-mig-manager nvidia-ctk /usr/bin/
RUN ["/busybox/sh", "-c", "rm -rf /var/run && ln -s /run /var/run"]
ENV NVIDIA_DISABLE_REQUIRE=true NVIDIA_VISIBLE_DEVICES=all NVIDIA_MIG_CONFIG_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=utility
ENTRYPOINT ["nvidia-mig-manager"]
EOF

cp /bin/bash-static "$work/bin/bash"
build dra-driver "$REF_DRA" <<EOF
FROM $base
COPY bash /bin/bash
COPY gpu-kubelet-plugin nvidia-cdi-hook /usr/bin/
ENV NVIDIA_DISABLE_REQUIRE=true NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=utility
EOF
