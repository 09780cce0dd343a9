#!/usr/bin/env bash
# The two images every node here needs and no registry serves: the pod sandbox ("pause") image the node's
# containerd is configured with, and a busybox for test pods. Both hold only Debian's busybox-static; the pause
# image runs `sleep` forever, which is all a sandbox container does under gVisor.
#
#   hack/image/node-images.sh DIR     -> DIR/pause.tar (localhost/pause:3.10), DIR/busybox.tar (localhost/busybox:e2e)
#
# Archives are docker-archive tarballs (`ctr images import` reads them); existing ones are kept.
set -euo pipefail
out="${1:?usage: node-images.sh DIR}"
mkdir -p "$out"
busybox=/bin/busybox
[[ -x "$busybox" ]] || { echo "node-images: $busybox not found (apt-get install busybox-static)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp "$busybox" "$work/busybox"
build() { # name archive cmd-json
  local name="$1" archive="$2" cmd="$3"
  [[ -s "$out/$archive" ]] && return 0
  printf 'FROM scratch\nCOPY busybox /bin/busybox\nRUN ["/bin/busybox", "--install", "-s", "/bin"]\nENV PATH=/bin\nCMD %s\n' \
    "$cmd" >"$work/Containerfile"
  buildah bud --quiet --isolation chroot -f "$work/Containerfile" -t "$name" "$work" >/dev/null
  buildah push --quiet "$name" "docker-archive:$out/$archive.part:$name" >/dev/null
  mv "$out/$archive.part" "$out/$archive"
}
build localhost/pause:3.10 pause.tar '["/bin/sleep", "2147483647"]'
build localhost/busybox:e2e busybox.tar '["/bin/sh"]'
