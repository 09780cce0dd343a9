#!/usr/bin/env bash
# Build the webhook image from webhook/Dockerfile with the first of docker, podman, buildah on PATH that can
# build: an engine that is there but cannot (a docker client without a daemon) is reported and the next tried.
#
#   hack/build-image.sh [IMAGE]     (make image IMAGE=registry/name:tag)
#
# IMAGE defaults to gpu-stack-webhook:<appVersion of charts/gpu-stack/Chart.yaml>. The build context is
# webhook/ (webhook/.dockerignore lets in only what the Dockerfile copies). The image is built, not pushed:
# push it to a registry the cluster's nodes pull from and install with
# --set webhook.image.repository=... --set webhook.image.tag=...
#
# Environment (all optional):
#   PYTHON_IMAGE   the base image, passed as the Dockerfile's build argument of that name (default in the
#                  Dockerfile: python:3.11-slim-bookworm). Only the base may differ; the Dockerfile is the same.
#   CA_BUNDLE      a CA bundle file the build's RUN steps that download trust instead of the base's own (a
#                  TLS-inspecting proxy between the build and the package index), passed to every engine as
#                  the build secret `ca_bundle` (--secret id=ca_bundle,src=...): the Dockerfile mounts it at
#                  /etc/ssl/certs/ca-certificates.crt for those steps only (RUN --mount=type=secret); it is not
#                  in the image.
#   IMAGE_ARCHIVE  also write the image to this file as a tarball: a docker-archive (`ctr images import`,
#                  `docker load`, `kind load image-archive` read it), or with IMAGE_ARCHIVE_FORMAT=oci-archive an
#                  OCI image layout (what `make release` ships; skopeo copies it to a registry). docker save
#                  writes one tarball that is both (Docker >= 25).
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

# An engine that answers `info` can build: docker's and podman's need their daemon or service, buildah none.
usable() {
  local engine="$1" out
  if out="$("$engine" info 2>&1 >/dev/null)"; then
    return 0
  fi
  local first="${out%%$'\n'*}"
  echo "build-image: $engine is on PATH but cannot build (${first:-$engine info failed}); trying the next engine" >&2
  return 1
}

case "${IMAGE_ARCHIVE_FORMAT:-docker-archive}" in
  docker-archive | oci-archive) ;;
  *) echo "build-image: IMAGE_ARCHIVE_FORMAT=$IMAGE_ARCHIVE_FORMAT: docker-archive or oci-archive" >&2; exit 1 ;;
esac

cd "$root"
tried=()
for engine in docker podman buildah; do
  command -v "$engine" >/dev/null 2>&1 || continue
  tried+=("$engine")
  usable "$engine" || continue
  if [[ "$engine" == buildah ]]; then
    command=(buildah bud)
  else
    command=("$engine" build)
  fi
  [[ -n "${PYTHON_IMAGE:-}" ]] && command+=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE")
  if [[ -n "${CA_BUNDLE:-}" ]]; then
    [[ -f "$CA_BUNDLE" ]] || { echo "build-image: CA_BUNDLE=$CA_BUNDLE is not a file" >&2; exit 1; }
    command+=(--secret "id=ca_bundle,src=$CA_BUNDLE")
  fi
  command+=(-f webhook/Dockerfile -t "$image" webhook)
  echo "+ ${command[*]}" >&2
  "${command[@]}"
  if [[ -n "${IMAGE_ARCHIVE:-}" ]]; then
    if [[ "$engine" != docker ]]; then
      save=("$engine" push --quiet "$image" "${IMAGE_ARCHIVE_FORMAT:-docker-archive}:$IMAGE_ARCHIVE:$image")
    else
      save=("$engine" save -o "$IMAGE_ARCHIVE" "$image")
    fi
    echo "+ ${save[*]}" >&2
    "${save[@]}"
  fi
  exit 0
done
if ((${#tried[@]})); then
  echo "build-image: no engine on PATH can build $image (tried ${tried[*]})" >&2
else
  echo "build-image: no container engine on PATH: install docker, podman or buildah to build $image" >&2
fi
exit 1
