# One Makefile for CI, the README and developers.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PLUGINS := $(sort $(dir $(wildcard plugins/*/pyproject.toml)))
KUBE_CACHE ?= /var/cache/reloadd/kube-v1.20.2
CONTAINERD_CACHE ?= /var/cache/reloadd/containerd
KUBECTL_CACHE ?= /var/cache/reloadd/kubectl-v1.20.2
export RELOADD_KUBE_BIN := $(KUBE_CACHE)
export RELOADD_KUBECTL := $(KUBECTL_CACHE)/kubectl
export RELOADD_CONTAINERD_CACHE := $(CONTAINERD_CACHE)

.PHONY: install deps kube containerd-releases test check demo bench faults protos clean image reference docs

$(BIN)/python:
	$(PY) -m venv $(VENV)

install: $(BIN)/python
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,docs]' $(foreach p,$(PLUGINS),-e ./$(p))

deps:
	bash scripts/infra/install-deps.sh

# kube-apiserver, controller-manager, scheduler and the kubelet v1.20.2 (the test bed's control plane and node).
kube: deps
	OUT=$(KUBE_CACHE) bash scripts/infra/build-kube-apiserver.sh
	OUT=$(KUBECTL_CACHE) bash scripts/infra/fetch-kubectl.sh

# containerd 1.7 (Debian trixie) and 2.x (sid), extracted beside the system's 1.6 for the test matrix.
containerd-releases: deps
	OUT=$(CONTAINERD_CACHE) bash scripts/infra/fetch-containerd.sh

test: deps kube containerd-releases install
	$(BIN)/pytest -q -p no:cacheprovider

# reloadd's OCI image archive, built offline from Debian packages and the project's wheels (reproducible): one
# OCI image index with linux/amd64 and linux/arm64 (arm64's Debian packages run under qemu-user-static).
# `make image PLATFORMS=amd64` builds one platform only.
PLATFORMS ?= amd64,arm64
image: deps install
	$(BIN)/python scripts/image/build_image.py build/reloadd-image.tar --platforms $(PLATFORMS)

check: install
	$(BIN)/ruff check src plugins tests bench examples
	$(BIN)/mypy src $(foreach p,$(PLUGINS),$(p)src)
	$(BIN)/python scripts/size_report.py

# `make demo DEMO_ARGS=--smoke` drops the samples itself and checks all three consumers.
demo: deps install
	$(BIN)/python -m examples.demo.run_demo $(DEMO_ARGS)

# Every figure in docs/benchmarks.md comes from this one run, at the suites' defaults.
bench: deps kube containerd-releases install
	mkdir -p build/bench
	$(BIN)/python -m bench --out docs/benchmarks-core.md
	$(BIN)/python -m bench.containerd_images --out build/bench/20-containerd-images.md
	$(BIN)/python -m bench.containerd_images --verify-only --runs 7 --out build/bench/22-containerd-verify.md
	$(BIN)/python -m bench.containerd_images.landing --md build/bench/25-containerd-landing.md
	$(BIN)/python -m bench.kube_manifests --md build/bench/30-kube-manifests.md
	$(BIN)/python -m bench.kube_manifests.node --md build/bench/35-kube-node.md
	$(BIN)/python -m bench.kube_manifests.health_requests --md build/bench/36-kube-health-requests.md
	$(BIN)/python -m bench.registry_mirrors --md build/bench/40-registry-mirrors.md
	$(BIN)/python -m bench.drift --md build/bench/50-drift.md
	$(BIN)/python -m bench.fleet --md build/bench/60-fleet.md
	$(BIN)/python -m bench.daemon --md build/bench/70-daemon.md
	$(BIN)/python -m bench.report docs/benchmarks.md docs/benchmarks-core.md build/bench/[0-9]*.md

# Every test file that records reliability rows (grep -l 'reliability.record' tests) is listed here;
# tests/reliability.py rewrites docs/reliability.md only if this session passes with nothing skipped.
faults: deps kube containerd-releases install
	RELOADD_RELIABILITY_REPORT=docs/reliability.md $(BIN)/pytest -q -p no:cacheprovider -m 'slow or not slow' \
	  tests/faults tests/observability/test_http_limits.py tests/core/test_pidfile.py \
	  tests/containerd_images/test_hostile.py tests/containerd_images/test_crash.py \
	  tests/containerd_images/test_release_race.py tests/kube_manifests/test_km_hostile.py \
	  tests/kube_manifests/test_km_crash_apiserver.py tests/registry_mirrors/test_hostile.py \
	  tests/registry_mirrors/test_crash.py tests/exec/test_crash.py \
	  tests/core/test_config_ranges.py tests/registry_mirrors/test_partial_apply.py \
	  tests/kube_manifests/test_km_kubeconfig.py tests/registry_mirrors/test_drop_in_files.py \
	  tests/registry_mirrors/test_consumer.py

# docs/reference/ is generated from the code (option reads, metric families, the CLI parser, docstrings);
# tests/docs/test_reference.py fails when it is out of date.
reference: install
	PYTHONPATH=scripts/docs $(BIN)/python -m docsgen

# The site, offline (no fonts, analytics or CDN fetched), into build/site/; tests/docs/test_site.py builds
# it too and opens every page in headless Chromium. Search needs it served: python3 -m http.server -d build/site
docs: reference
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

protos: install
	bash plugins/containerd-images/gen_protos.sh

clean:
	rm -rf $(VENV) build dist
