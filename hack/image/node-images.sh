#!/usr/bin/env bash
# The images a node here needs and no registry serves, from Debian's static binaries:
#   DIR/pause.tar    localhost/pause:3.10     the pod sandbox image the node's containerd is configured with:
#                                             busybox `sleep` forever, all a sandbox container does under gVisor
#   DIR/busybox.tar  localhost/busybox:e2e    busybox, for test pods
#   DIR/kubectl.tar  localhost/kubectl:e2e    bash and KUBECTL at /usr/local/bin/kubectl: what the chart's
#                                             `helm test` pods use of registry.k8s.io/kubectl (bash, kubectl)
#
#   hack/image/node-images.sh DIR KUBECTL
#
# Archives are docker-archive tarballs (`ctr images import` reads them); existing ones are kept.
set -euo pipefail
out="${1:?usage: node-images.sh DIR KUBECTL}"
kubectl="${2:?usage: node-images.sh DIR KUBECTL}"
mkdir -p "$out"
busybox=/bin/busybox
[[ -x "$busybox" ]] || { echo "node-images: $busybox not found (apt-get install busybox-static)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
[[ -x /bin/bash-static ]] || { echo "node-images: /bin/bash-static not found (apt-get install bash-static)" >&2; exit 1; }
cp "$busybox" "$work/busybox"
cp /bin/bash-static "$work/bash"
cp "$kubectl" "$work/kubectl"
build() { # name archive cmd-json [extra Containerfile lines]
  local name="$1" archive="$2" cmd="$3" extra="${4:-}"
  [[ -s "$out/$archive" ]] && return 0
  printf 'FROM scratch\nCOPY busybox /bin/busybox\nRUN ["/bin/busybox", "--install", "-s", "/bin"]\n%bENV PATH=/usr/local/bin:/bin\nCMD %s\n' \
    "$extra" "$cmd" >"$work/Containerfile"
  buildah bud --quiet --isolation chroot -f "$work/Containerfile" -t "$name" "$work" >/dev/null
  buildah push --quiet "$name" "docker-archive:$out/$archive.part:$name" >/dev/null
  mv "$out/$archive.part" "$out/$archive"
}
build localhost/pause:3.10 pause.tar '["/bin/sleep", "2147483647"]'
build localhost/busybox:e2e busybox.tar '["/bin/sh"]'
build localhost/kubectl:e2e kubectl.tar '["/usr/local/bin/kubectl"]' \
  'COPY bash /bin/bash\nCOPY kubectl /usr/local/bin/kubectl\n'
