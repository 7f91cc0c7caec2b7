# relayrl: `make demo` and `make test` do all the set-up on a fresh machine.
# The first of python3.11, 3.12, 3.13 on PATH (the versions the locks install on); `make setup PY=...` picks one.
PY ?= $(firstword $(foreach v,3.11 3.12 3.13,$(shell command -v python$(v) 2>/dev/null)))
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The GPU lock when `nvidia-smi -L` lists a GPU, the CPU lock otherwise: never both (they hold different torch and
# vllm builds of the same packages). `make setup LOCK=requirements/gpu.lock` forces one.
GPU := $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo yes)
LOCK ?= $(if $(GPU),requirements/gpu.lock,requirements/cpu.lock)
PIP := $(BIN)/python -m pip install -q
# The local wheel mirror warns about every index it skips; keep real errors.
QUIET := { grep -v 'is ignored: it is neither' || true; }
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec

export VLLM_CPU_KVCACHE_SPACE ?= 1
export VLLM_CPU_OMP_THREADS_BIND ?= 0-1
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE := 1
# Modules compile on their first import, into the environment (requirements/install.sh says why): these machines set
# PYTHONDONTWRITEBYTECODE, under which every process would compile torch, vLLM and Ray from source.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup demo test test-fast lint browser bench clean

setup: $(STAMP)

$(STAMP): $(LOCK) pyproject.toml
	@test -n "$(PY)" && $(PY) -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' || { echo \
	  "make setup: needs Python 3.11, 3.12 or 3.13 (PY='$(PY)'): install one, or pass PY=/path/to/python3.12" >&2; exit 1; }
	@$(if $(findstring gpu,$(LOCK)),$(PY) relayrl/run/preflight.py driver $(LOCK))
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	bash requirements/install.sh $(VENV) $(LOCK)  # uv where it can be had, else pip
	$(PIP) --no-deps --no-build-isolation -e . 2>&1 | $(QUIET)
	@touch $(STAMP)

demo: setup
	$(BIN)/relayrl demo

# Two pytest workers (pytest-xdist): most of a test's wall time is a process starting, a Ray head, an engine
# loading, a timeout running out, so two workers on two cores take ~1.5x less time than one. Tests that must not
# run beside each other share an `xdist_group` (tests/conftest.py). `make test WORKERS=0` runs them one by one.
WORKERS ?= 2
XDIST := $(if $(filter 0,$(WORKERS)),-n 0,-n $(WORKERS) --dist loadgroup)

# Lint runs beside the tests (pyright is ~40 s of one core; the tests wait on processes starting much of the
# time): its output comes after theirs, and either failing fails `make test`.
LINT_LOG := $(VENV)/lint.log
test: setup browser
	@$(MAKE) --no-print-directory lint >$(LINT_LOG) 2>&1 & lint=$$!; \
	$(BIN)/python -m pytest -q -rs --durations=25 $(XDIST) tests && tests=0 || tests=$$?; \
	wait $$lint && linted=0 || linted=$$?; cat $(LINT_LOG); \
	if [ $$linted != 0 ]; then echo "make test: lint failed (above)" >&2; fi; \
	exit $$(( tests || linted ))

lint: setup  # ruff's lint rules and format, and pyright (basic) on relayrl/, from pyproject.toml
	$(BIN)/ruff check relayrl tests benchmarks
	$(BIN)/ruff format --check relayrl tests benchmarks
	$(BIN)/pyright -p pyproject.toml

# Chromium for the report's screenshot test (tests/integration/test_report_browser.py): installed from the Debian
# packages when missing and the user is root; otherwise that test skips, saying why.
BROWSER_LOG := /tmp/relayrl-apt-chromium.log
HAVE_BROWSER := command -v chromium || command -v chromium-browser || command -v google-chrome
browser:
	@if ! { $(HAVE_BROWSER); } >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium (apt-get, log: $(BROWSER_LOG)) for the report's browser test"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    { apt-get install -y -q --no-install-recommends chromium \
	      || { apt-get update -q && apt-get install -y -q --no-install-recommends chromium; }; } >$(BROWSER_LOG) 2>&1 \
	      || echo "chromium not installed (see $(BROWSER_LOG)): the report's browser test will skip"; \
	  else echo "no chromium and not root: the report's browser test will skip"; fi; \
	fi

test-fast: setup
	$(BIN)/python -m pytest -q --durations=10 $(XDIST) tests/unit

bench: setup  # the benchmark suite, one table vs the targets; `make bench QUICK=1` for a smoke run
	$(BIN)/python benchmarks/suite.py $(if $(QUICK),--quick)

clean:
	rm -rf $(VENV) runs .pytest_cache
