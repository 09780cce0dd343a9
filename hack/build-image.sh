#!/usr/bin/env bash
# Build the webhook image from webhook/Dockerfile with the first of docker, podman, buildah on PATH.
#
#   hack/build-image.sh [IMAGE]     (make image IMAGE=registry/name:tag)
#
# IMAGE defaults to gpu-stack-webhook:<appVersion of charts/gpu-stack/Chart.yaml>, the name `helm template`
# renders when webhook.image.repository is empty. The build context is webhook/ (webhook/.dockerignore
# lets in only what the Dockerfile copies). The image is built, not pushed: push it to a registry the
# cluster's nodes pull from and install with --set webhook.image.repository=... --set webhook.image.tag=...
# Bash builtins only (besides the engine), so that tests can run it with a PATH of fake engines.
set -euo pipefail

here="${BASH_SOURCE[0]%/*}"
[[ "$here" == "${BASH_SOURCE[0]}" ]] && here=.
root="$(cd "$here/.." && pwd)"
chart_yaml="$root/charts/gpu-stack/Chart.yaml"

image="${1:-}"
if [[ -z "$image" ]]; then
  app_version=""
  while IFS= read -r line || [[ -n "$line" ]]; do
    if [[ "$line" =~ ^appVersion:[[:space:]]*[\"\']?([^\"\'[:space:]]+) ]]; then
      app_version="${BASH_REMATCH[1]}"
      break
    fi
  done <"$chart_yaml"
  if [[ -z "$app_version" ]]; then
    echo "build-image: no appVersion in $chart_yaml; pass IMAGE (make image IMAGE=registry/name:tag)" >&2
    exit 1
  fi
  image="gpu-stack-webhook:$app_version"
fi

cd "$root"
for engine in docker podman buildah; do
  if command -v "$engine" >/dev/null 2>&1; then
    if [[ "$engine" == buildah ]]; then
      command=(buildah bud -f webhook/Dockerfile -t "$image" webhook)
    else
      command=("$engine" build -f webhook/Dockerfile -t "$image" webhook)
    fi
    echo "+ ${command[*]}" >&2
    exec "${command[@]}"
  fi
done
echo "build-image: no container engine on PATH: install docker, podman or buildah to build $image" >&2
exit 1
