# One Makefile for CI, the README and developers.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PLUGINS := $(sort $(dir $(wildcard plugins/*/pyproject.toml)))
KUBE_CACHE ?= /var/cache/reloadd/kube-v1.20.2
export RELOADD_KUBE_BIN := $(KUBE_CACHE)

.PHONY: install deps kube test check demo bench faults protos clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

install: $(BIN)/python
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]' $(foreach p,$(PLUGINS),-e ./$(p))

deps:
	bash scripts/infra/install-deps.sh

kube: deps
	OUT=$(KUBE_CACHE) bash scripts/infra/build-kube-apiserver.sh

test: deps kube install
	$(BIN)/pytest -q -p no:cacheprovider

check: install
	$(BIN)/ruff check src plugins tests bench examples
	$(BIN)/mypy src $(foreach p,$(PLUGINS),$(p)src)

demo: deps install
	$(BIN)/python -m examples.demo.run_demo

bench: deps kube install
	$(BIN)/python -m bench
	$(BIN)/python -m bench.registry_mirrors
	$(BIN)/python -m bench.containerd_images
	$(BIN)/python -m bench.kube_manifests

faults: deps kube install
	RELOADD_RELIABILITY_REPORT=docs/reliability.md $(BIN)/pytest -q -p no:cacheprovider tests/faults -m 'slow or not slow'

protos: install
	bash plugins/containerd-images/gen_protos.sh

clean:
	rm -rf $(VENV) build dist
