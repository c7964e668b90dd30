# Two entry points, each doing its own setup on a fresh machine:
#   make demo   -> a local daemon + a Keras model trained through the cache
#   make test   -> lint + the whole test suite (what .ci/run runs)
#                  tests/README: how to run part of it, and where its time goes
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
EXTRAS ?= tf-cpu,dev

.PHONY: demo test lint bench bench-quick screenshots proto

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[$(EXTRAS)]'
	touch $@

demo: $(VENV)/.installed
	$(BIN)/cacheserver demo

lint: $(VENV)/.installed
	$(BIN)/ruff check cacheserver client tests bench protos
	$(BIN)/mypy cacheserver client
	$(BIN)/lint-imports
	$(BIN)/python .ci/import_cycles.py

test: lint
	$(BIN)/python -m pytest -q -p no:cacheprovider -n auto --dist loadfile

# make bench: the full benchmark (~28 min on 2 cores; root for the memory cgroup), raw results
# in bench/results/latest.json, report and plots rewritten in docs/benchmarks.md and docs/img/.
# make bench-quick: the same on small sizes (~3 min): bench/results/quick.json, report on stdout.
bench: $(VENV)/.installed
	$(BIN)/python bench/run.py --doc docs/benchmarks.md

bench-quick: $(VENV)/.installed
	$(BIN)/python bench/run.py --quick

# make screenshots: docs/img/tensorboard_input_stall.png and docs/img/cacheserver_top.png from a
# real daemon and real Keras training (~1 min); needs the screenshots extra
# ($(BIN)/pip install -e '.[screenshots]') and Chromium (apt-get install -y chromium).
screenshots: $(VENV)/.installed
	$(BIN)/python bench/screenshots.py

proto: $(VENV)/.installed
	$(BIN)/python protos/generate.py
