# gemma4-bench: every target creates .venv (Python >= 3.12, pinned by constraints.txt) when it is missing.
# Main job:  make sweep     Tests:  make test
VENV      := .venv
PY        := $(VENV)/bin/python
BENCH     := $(VENV)/bin/bench
STAMP     := $(VENV)/.installed
INPUTS    ?= 41,521,2057,3593
ARGS      ?=
# The transformers peer (make peer): its own venv, never the project's; see scripts/transformers_peer.py.
PEER_PYTHON  ?= python3.11
PEER_VENV    := .venv-peer
PEER_PY      := $(PEER_VENV)/bin/python
PEER_STAMP   := $(PEER_VENV)/.installed
PEER_DIR     := .cache/peer
PEER_THREADS ?= 2
PEER_NAME    ?=

.PHONY: help venv docs fleet-venv test-fleet test test-suite test-fast test-heavy canary gpu-rehearsal tpu-rehearsal sweep peer profile report generate lock clean

help:
	@echo "make sweep    run the default sweep (inputs $(INPUTS)) on the built-in checkpoint; writes runs/<name>/"
	@echo "make test     everything CI runs: test-suite, docs, test-fleet, gpu-rehearsal, tpu-rehearsal"
	@echo "make test-suite  the main test suite alone (lint-imports, then three pytest processes sharing one XLA cache)"
	@echo "make canary   the measured-quantity checks (speeds, shares), figures to $(CANARY_OUT); on a quiet machine"
	@echo "make test-heavy  the tests marked heavy (minutes each: every --quant option's accuracy on the default preset)"
	@echo "make peer     transformers on the same checkpoint, prompts and token counts (its own .venv-peer); writes runs/<name>/"
	@echo "make profile  xprof trace of 20 decode steps + device-time breakdown, added to the latest sweep run"
	@echo "make report   tables and plots comparing the archived runs in runs/ -> reports/latest/"
	@echo "make docs     the documentation site (docs/, mkdocs.yml) built strictly into site/"
	@echo "make test-fleet  the bench fleet tests in .venv-fleet (SkyPilot installed: its schema checks run)"
	@echo "make gpu-rehearsal  scripts/gpu-run.sh --tiny on this CPU with the GPU image's packages + carried wheels"
	@echo "make tpu-rehearsal  the same with the TPU image's Python 3.11 + jax 0.10.2 + scripts/tpu-wheels.sh's wheels"
	@echo "make lock     re-pin constraints.txt from the current .venv"

$(STAMP): pyproject.toml constraints.txt
	@if [ ! -x $(PY) ]; then \
	  py=$$(scripts/find-python.sh) || exit 1; \
	  echo "creating $(VENV) with $$py"; \
	  "$$py" -m venv $(VENV) || exit 1; \
	fi
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install -qq -c constraints.txt -e '.[dev]'  # -qq: no build-backend chatter
	@touch $(STAMP)

venv: $(STAMP)

# `make test` is what CI runs (.ci/run runs it alone): the main suite (test-suite), the documentation site's strict
# build (docs), the fleet tests with SkyPilot installed (test-fleet), and the GPU and TPU runs rehearsed with those
# images' packages. Their own targets run a part. A new CI step goes here, so .ci/run and `make test` stay one.
test: test-suite docs test-fleet gpu-rehearsal tpu-rehearsal

# lint-imports: the import contracts in pyproject.toml (the house plan's walls) before the tests. The suite runs in
# three pytest processes (test files a-h, i-q, r-z): twice, late in one whole-suite process of some 1,300 tests,
# XLA crashed the process while compiling or writing the persistent compilation cache (a SIGABRT, a SIGSEGV; never
# in a smaller process), which took every later test with it. Each chunk is a process of the size that never did.
# The chunks share one persistent XLA compilation cache, made for this invocation and removed at its end
# (tests/conftest.py: a program compiled once is loaded from disk by every later module and chunk; nothing is kept
# between invocations, so a crash mid-write cannot leave a broken entry for the next run). The fleet tests run once,
# in test-fleet (SkyPilot installed there); the tests marked canary (measured speeds and shares) in `make canary`.
# TEST_XLA_CACHE=DIR keeps the cache in DIR across invocations instead (a warm cache: test_engine.py alone took 38 s
# of CPU warm against 256 s cold on 2 busy cores, 2026-12-07); delete DIR if a crash leaves it in doubt.
# TEST_JOBS=2 runs two chunks at a time (each chunk's output printed when it ends): on two idle cores about the
# CPU time over 2 instead of over the 1.2 cores one process keeps busy; the cache writes each entry whole
# (tests/conftest.py), so a chunk never reads another's half-written entry. Not measured here on a quiet machine yet.
TEST_XLA_CACHE ?=
TEST_JOBS   ?= 1
FLEET_TESTS := $(wildcard tests/test_fleet*.py)
TEST_CHUNKS := $(foreach g,[a-h] [i-q] [r-z],"$(filter-out $(FLEET_TESTS),$(wildcard tests/test_$(g)*.py))")
TEST_MARKS  := not heavy and not canary
test-suite: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	@set -e; if [ -n "$(TEST_XLA_CACHE)" ]; then cache="$(TEST_XLA_CACHE)"; mkdir -p "$$cache"; else \
	  cache=$$(mktemp -d "$${TMPDIR:-/tmp}/gemma4-bench-test-xla.XXXXXX"); trap 'rm -rf "$$cache"' EXIT; trap 'exit 130' INT TERM; fi; \
	if [ "$(TEST_JOBS)" = 1 ]; then \
	  for chunk in $(TEST_CHUNKS); do \
	    echo "pytest $${chunk%% *} ... $${chunk##* }"; \
	    GEMMA4_BENCH_TEST_XLA_CACHE=$$cache $(PY) -m pytest -q -m "$(TEST_MARKS)" $(ARGS) $$chunk || [ $$? -eq 5 ]; \
	  done; \
	else \
	  printf '%s\n' $(TEST_CHUNKS) | GEMMA4_BENCH_TEST_XLA_CACHE=$$cache xargs -P "$(TEST_JOBS)" -I{} sh -c \
	    'set -- {}; log=$$(mktemp); $(PY) -m pytest -q -m "$(TEST_MARKS)" $(ARGS) "$$@" >"$$log" 2>&1; rc=$$?; \
	     eval last=\$${$$#}; echo "pytest $$1 ... $$last"; cat "$$log"; rm -f "$$log"; [ $$rc -eq 0 ] || [ $$rc -eq 5 ]'; \
	fi  # exit 5: no test of a chunk selected (e.g. ARGS="-k NAME"), not a failure

# The tests marked heavy: minutes each on 2 cores (e.g. every --quant option's accuracy on the default preset),
# with the suite's quick compiles (tests/conftest.py: no speed is measured there).
test-heavy: $(STAMP)
	GEMMA4_BENCH_TEST_XLA_OPT=quick $(PY) -m pytest -q -m heavy $(ARGS)

# One process, no slow tests: a quick check while working (not what CI runs).
test-fast: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q -m "not slow and $(TEST_MARKS)" $(ARGS) $(filter-out $(FLEET_TESTS),$(wildcard tests/test_*.py))

# The tests marked canary: measured quantities (a copy's bandwidth against numpy's, profile shares of one program
# at two step counts) checked against bounds that a busy host can break, so not in `make test`. Each figure is
# printed and written to $(CANARY_OUT) with the host's load; run it on a quiet machine. Not in CI.
CANARY_OUT ?= .cache/canary/canary.json
canary: $(STAMP)
	GEMMA4_BENCH_CANARY_OUT=$(CANARY_OUT) $(PY) -m pytest -q -m canary $(ARGS)

# bench fleet (SkyPilot) in its own venv: skypilot 0.14.1 pins click < 8.2 and uvicorn < 0.36, which constraints.txt
# refuses; constraints-fleet.txt lowers those pins (docs/devices/fleet.md).
FLEET_VENV  := .venv-fleet
FLEET_STAMP := $(FLEET_VENV)/.installed
$(FLEET_STAMP): pyproject.toml constraints-fleet.txt
	@if [ ! -x $(FLEET_VENV)/bin/python ]; then \
	  py=$$(scripts/find-python.sh) || exit 1; \
	  echo "creating $(FLEET_VENV) with $$py"; \
	  "$$py" -m venv $(FLEET_VENV) || exit 1; \
	fi
	$(FLEET_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(FLEET_VENV)/bin/python -m pip install -qq -c constraints-fleet.txt -e '.[dev,fleet]'
	@touch $(FLEET_STAMP)

fleet-venv: $(FLEET_STAMP)

test-fleet: $(FLEET_STAMP)
	$(FLEET_VENV)/bin/python -m pytest -q -m "$(TEST_MARKS)" $(ARGS) $(FLEET_TESTS) || [ $$? -eq 5 ]

# The documentation site: MkDocs + Material (the `docs` extra, pinned by constraints.txt) installed into .venv
# beside the project, then a strict build into site/ (git-ignored): a link or #anchor that does not resolve inside
# docs/ fails it (mkdocs.yml's validation). NO_MKDOCS_2_WARNING quiets the theme's banner about its successor.
DOCS_STAMP := $(VENV)/.installed-docs
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -qq -c constraints.txt -e '.[docs]'
	@touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# Needs no .venv: it builds (and caches) its own venv of the GPU image's versions; see scripts/gpu-rehearsal.sh.
gpu-rehearsal:
	scripts/gpu-rehearsal.sh

# Needs no .venv: a Python 3.11 venv of the TPU image's jax 0.10.2 (cached); see scripts/tpu-rehearsal.sh.
tpu-rehearsal:
	scripts/tpu-rehearsal.sh

sweep: $(STAMP)
	$(BENCH) sweep --inputs $(INPUTS) $(ARGS)

# Not in CI. ARGS go to `bench peer plan` (the sweep's workload flags: --max-new-tokens, --repeats, --checkpoint);
# PEER_NAME labels the run (default: transformers, -2, -3, ... when taken); PEER_THREADS is torch's thread count.
$(PEER_STAMP):
	@if [ ! -x $(PEER_PY) ]; then \
	  echo "creating $(PEER_VENV) with $(PEER_PYTHON)"; \
	  $(PEER_PYTHON) -m venv $(PEER_VENV) || exit 1; \
	fi
	$(PEER_PY) -m pip install -qq torch==2.13.0 transformers==5.24.0 safetensors numpy
	@touch $(PEER_STAMP)

peer: $(STAMP) $(PEER_STAMP)
	$(BENCH) peer plan --inputs $(INPUTS) --out $(PEER_DIR)/plan.json $(ARGS)
	$(PEER_PY) scripts/transformers_peer.py $(PEER_DIR)/plan.json $(PEER_DIR)/requests.jsonl --threads $(PEER_THREADS)
	$(BENCH) peer import $(PEER_DIR)/requests.jsonl $(if $(PEER_NAME),--name $(PEER_NAME))

profile: $(STAMP)
	$(BENCH) profile --steps 20 --run latest $(ARGS)

report: $(STAMP)
	$(BENCH) report --out reports/latest $(ARGS)

generate: $(STAMP)
	$(BENCH) generate --prompt "Explain what a KV cache is." $(ARGS)

lock: $(DOCS_STAMP)  # the docs extra installed, so its pins stay in constraints.txt
	$(PY) -m pip freeze --exclude-editable | grep -v '^gemma4-bench' > constraints.txt

clean:
	rm -rf $(VENV) build site *.egg-info
