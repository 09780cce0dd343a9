# gpu-stack: make test (what CI runs), make demo (the webhook live over TLS + the chart rendered).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: all venv test demo lint bench helm clean

all: test

$(STAMP): requirements.lock webhook/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e webhook
	touch $@

venv: $(STAMP)

helm:
	@hack/ensure-helm.sh >/dev/null

test: $(STAMP) helm
	$(PY) -m pytest -n 2 tests

lint: $(STAMP)
	$(VENV)/bin/ruff check webhook tests hack
	$(VENV)/bin/mypy

demo: $(STAMP) helm
	$(PY) hack/demo.py

bench: $(STAMP)
	$(PY) hack/bench_policy.py

clean:
	rm -rf $(VENV) .tools .demo .pytest_cache .mypy_cache .ruff_cache
