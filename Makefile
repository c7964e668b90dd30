# Two entry points, each doing its own setup on a fresh machine:
#   make demo   -> a local daemon + a Keras model trained through the cache
#                  (installs the project and TensorFlow only)
#   make test   -> lint + the whole test suite (what .ci/run runs)
#                  tests/README: how to run part of it, and where its time goes
# While you work:
#   make unit                   -> tests/unit alone, no lint
#   make test ARGS='-k fleet'   -> lint, then the suite with pytest's own options added
#   make lint                   -> ruff (lint and format), mypy, import contracts
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# TensorFlow's build: tf-cpu, or tf (with GPU support)
TF     ?= tf-cpu
# more pytest options for make test and make unit
ARGS   ?=

.PHONY: demo test unit lint bench bench-quick bench-check screenshots proto

# One stamp per purpose, each installing the extras it needs into the one .venv (again when
# pyproject.toml changes): demo TensorFlow alone; dev the tests' libraries, servers and lint
# tools; bench the benchmarks'; screenshots TensorBoard's.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.demo: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[$(TF)]'
	touch $@

$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[$(TF),dev]'
	touch $@

$(VENV)/.bench: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[$(TF),bench]'
	touch $@

$(VENV)/.screenshots: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[$(TF),screenshots]'
	touch $@

demo: $(VENV)/.demo
	$(BIN)/cacheserver demo

lint: $(VENV)/.dev
	$(BIN)/ruff check cacheserver client tests bench protos
	$(BIN)/ruff format --check cacheserver client tests bench protos
	$(BIN)/mypy cacheserver client
	$(BIN)/lint-imports
	$(BIN)/python .ci/import_cycles.py

test: lint
	$(BIN)/python -m pytest -q -p no:cacheprovider -n auto --dist loadfile $(ARGS)

unit: $(VENV)/.dev
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit $(ARGS)

# make bench: the full benchmark (~28 min on 2 cores; root for the memory cgroup), raw results
# in bench/results/latest.json, report and plots rewritten in docs/benchmarks.md and docs/img/.
# make bench-quick: the same on small sizes (~3 min): bench/results/quick.json, report on stdout.
bench: $(VENV)/.bench
	$(BIN)/python bench/run.py --doc docs/benchmarks.md

bench-quick: $(VENV)/.bench
	$(BIN)/python bench/run.py --quick

# make bench-check: fails when docs/benchmarks.md's generated block was measured from other bench
# inputs (bench/inputs.py) than this tree's; make bench then measures them again.
bench-check: $(VENV)/.demo
	$(BIN)/python bench/render.py --check docs/benchmarks.md

# make screenshots: docs/img/tensorboard_input_stall.png and docs/img/cacheserver_top.png from a
# real daemon and real Keras training (~1 min); needs Chromium (apt-get install -y chromium).
screenshots: $(VENV)/.screenshots
	$(BIN)/python bench/screenshots.py

proto: $(VENV)/.dev
	$(BIN)/python protos/generate.py

# --- the container image (docs/deploy.md, "The image") --------------------------------------
# make image: deploy/container/Containerfile built with podman from a wheelhouse of this host's
# pip, on a Debian base made from packages (debootstrap, cached under /var/tmp) unless
# IMAGE_BASE names one to pull (IMAGE_BASE=python:3.11-slim). make image-tf: the same with
# TensorFlow, for daemons that materialize. make image-test: tests/image, the image and the
# sidecar pod run with podman (root; a few minutes): run it before landing changes to deploy/.
IMAGE      ?= localhost/shardcache:0.1.0
IMAGE_BASE ?=

.PHONY: image image-tf image-test

image:
	IMAGE='$(IMAGE)' IMAGE_BASE='$(IMAGE_BASE)' EXTRAS=s3 PYTHON='$(PYTHON)' \
		deploy/container/build-image.sh

image-tf:
	IMAGE='$(IMAGE)-tf' IMAGE_BASE='$(IMAGE_BASE)' EXTRAS=s3,tf-cpu PYTHON='$(PYTHON)' \
		deploy/container/build-image.sh

image-test: image $(VENV)/.dev
	SHARDCACHE_IMAGE_TESTS=1 SHARDCACHE_IMAGE='$(IMAGE)' \
		$(BIN)/python -m pytest -q -p no:cacheprovider tests/image
