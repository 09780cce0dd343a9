#!/usr/bin/env bash
# Make promtool (Prometheus' rule checker and unit-test runner) available and print its path.
#
#   hack/ensure-promtool.sh            -> prints the path of promtool
#   hack/ensure-promtool.sh prometheus -> prints the path of the prometheus server (same package)
#
# A promtool on PATH is used as it is. Otherwise, as root with apt (CI: a fresh Debian machine), Debian's
# `prometheus` package is installed, which ships both binaries (/usr/bin/promtool, /usr/bin/prometheus).
# Idempotent: a second run finds them on PATH and installs nothing.
set -euo pipefail

binary="${1:-promtool}"
case "$binary" in
  promtool|prometheus) ;;
  *) echo "usage: $0 [promtool|prometheus]" >&2; exit 2 ;;
esac

if ! command -v "$binary" >/dev/null 2>&1; then
  if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "$0: $binary is not on PATH; install Debian's prometheus package (apt-get install prometheus)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends prometheus >&2; then
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends prometheus >&2
  fi
fi
command -v "$binary"
