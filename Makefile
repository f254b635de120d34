# Two commands do everything on a fresh machine:
#   make book   create .venv from requirements.txt, execute every chapter, build the HTML book
#   make test   the same set-up, then every check (lint, notebooks stripped, unit tests,
#               notebooks under nbmake, the book with warnings as errors, the whole-book PDF
#               beside the trained claims under two variants, the browser check)
# and two more:
#   make bench  run every benchmark in benchmarks/ (never part of the tests)
#   make claims rerun every trained claim under the variants that stand for other processors

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
STAMP  := $(VENV)/.installed
HTML   := _build/html
# Everything a chapter's outputs depend on besides its own cells. jupyter-cache hashes only a
# notebook's code cells, so a change here must clear the execution cache.
CACHE_INPUTS = $(sort $(wildcard companion/*.py companion/*/*.py benchmarks/recorded/*.json)) \
	requirements.txt
CACHE_KEY    := _build/.companion-key
NOTEBOOKS     = $(sort $(wildcard book/*.ipynb))
# Test processes run side by side (pytest-xdist) in the unit, notebook and browser stages:
# `make test JOBS=8` on a larger machine. Each runs its torch on one thread (two processes
# on two threads each would fight over 2 cores).
JOBS ?= 2
# torch 2.13's cache of compiled kernels (Inductor's, in the temporary folder) does not key on
# ATEN_CPU_CAPABILITY: a kernel compiled for AVX2, reused under ATEN_CPU_CAPABILITY=default (a
# variant of make claims, and of a whole make test), no longer compiles ("'at::vec' has not been
# declared"). So one cache per capability, unless the caller chose one.
export TORCHINDUCTOR_CACHE_DIR ?= $(or $(TMPDIR),/tmp)/torchinductor_$(shell id -un)_$(or $(ATEN_CPU_CAPABILITY),native)
# The order the chapters are handed to JOBS=2 workers. pytest-xdist's worksteal gives the
# first worker the first half of the list and the second the rest, then moves queued (never
# running) chapters from a busy worker to an idle one. So the two long chapters (07_tiny_
# transformer and 04_relative_positions, about 200 s each on one thread) must head different
# halves: listed side by side they both went to the first worker, one after the other (its
# share 408 s of the stage's 416 s, the other worker idle for half of it). The third longest,
# 09_modern_decoders (about 50 s), follows 04_relative_positions.
SLOW_NOTEBOOKS = book/07_tiny_transformer.ipynb book/04_relative_positions.ipynb \
	book/09_modern_decoders.ipynb
SHORT_NOTEBOOKS = $(filter-out $(SLOW_NOTEBOOKS),$(NOTEBOOKS))
SHORT_HALF = $(wordlist 1,$(shell echo $$(( ($(words $(NOTEBOOKS)) / 2) - 1 ))),$(SHORT_NOTEBOOKS))
NB_ORDER = book/07_tiny_transformer.ipynb $(SHORT_HALF) book/04_relative_positions.ipynb \
	book/09_modern_decoders.ipynb $(filter-out $(SHORT_HALF),$(SHORT_NOTEBOOKS))

.PHONY: help venv book book-strict test lint strip-check unit notebooks browser pdf pdf-check bench clean lab \
	install-check claims claims-ci floors

help:
	@echo "make book   - set up .venv and build the HTML book (every chapter executed)"
	@echo "make test   - set up .venv and run every check"
	@echo "make bench  - run the benchmarks in benchmarks/ (writes benchmarks/results/)"
	@echo "make claims - rerun every trained claim under 6 variants (jitter, threads, ATen, seeds)"
	@echo "make pdf    - print the whole book to _build/pdf/book.pdf (after make book)"
	@echo "make lab    - set up .venv and open JupyterLab on the chapters"
	@echo "make install-check - does requirements.txt resolve on macOS, Windows, Linux (network)"
	@echo "make floors - pyproject.toml's lower bounds installed exactly, then the unit tests (network)"
	@echo "make clean  - remove _build (keeps .venv)"

# --- set-up ---------------------------------------------------------------------------------
$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	@# Linux: torch's CPU build first (PyPI's is the CUDA build; see requirements.txt), from
	@# PyTorch's index when it answers within 5 s; where it does not (an offline mirror), pip
	@# takes torch from the configured index with the rest of the lock, with no retries wasted
	@if [ "$$(uname -s)" = Linux ] && $(PY) -c "import urllib.request as u; \
			u.urlopen('https://download.pytorch.org/whl/cpu/torch/', timeout=5)" 2>/dev/null; then \
		$(PY) -m pip install --quiet --disable-pip-version-check --retries 1 --timeout 15 \
			--extra-index-url https://download.pytorch.org/whl/cpu \
			"$$(grep '^torch==' requirements.txt)"; \
	else echo "download.pytorch.org not reachable: torch from the configured index"; fi
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@touch $(STAMP)

venv: $(STAMP)

# Learners: the same environment, then JupyterLab on the chapters (book/00_environment first).
# The book's JupyterLab defaults (scripts/jupyterlab_overrides.json: every cell rendered, no
# windowing that shows raw MyST while scrolling) go where JupyterLab reads an environment's
# defaults; a learner's own settings still win.
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings
lab: venv
	@mkdir -p $(LAB_SETTINGS) && cp scripts/jupyterlab_overrides.json $(LAB_SETTINGS)/overrides.json
	$(BIN)/jupyter lab book/

# Chapter outputs depend on companion/ as well as on their own cells, but neither jupyter-cache
# (it hashes a notebook's code cells) nor Sphinx (it re-reads a page only when its source
# changes) knows that. So both are keyed on a hash of companion/*.py and requirements.txt:
# - the execution cache (_build/.jupyter_cache) is cleared whenever that hash differs from the
#   one it was filled under (EXEC_KEY), before anything reads or adds to it;
# - the build re-reads every page (--all) when the hash differs from the last successful
#   build's (CACHE_KEY), which renders every chapter from the fresh cache.
# With no change, a rebuild serves every chapter from the cache and re-reads nothing: correct,
# and quick. `make notebooks` fills the same cache (scripts/nbmake_cache.py), so in `make test`
# the book stage renders the outputs nbmake just produced instead of running every chapter again.
EXEC_KEY := _build/.jupyter_cache-key
define fresh_cache
	@key=$$(cat $(CACHE_INPUTS) | sha256sum | cut -d' ' -f1); \
	if [ "$$(cat $(EXEC_KEY) 2>/dev/null)" != "$$key" ]; then \
		echo "companion/ or requirements.txt changed: clearing the execution cache"; \
		rm -rf _build/.jupyter_cache; mkdir -p _build; echo "$$key" > $(EXEC_KEY); \
	fi
endef

define build_book
	$(call fresh_cache)
	@key=$$(cat $(CACHE_INPUTS) | sha256sum | cut -d' ' -f1); extra="$(1)"; \
	if [ "$$(cat $(CACHE_KEY) 2>/dev/null)" != "$$key" ]; then \
		echo "companion/ or requirements.txt changed since the last build: re-reading every page"; \
		extra="--all $(1)"; \
	fi; \
	echo "$(BIN)/jupyter-book build . $$extra"; \
	$(BIN)/jupyter-book build . $$extra && mkdir -p _build && echo "$$key" > $(CACHE_KEY)
endef

# --- the book -------------------------------------------------------------------------------
book: venv
	$(call build_book,)
	@echo "The book is at $(abspath $(HTML))/index.html"

# The check build: every page re-read (--all), nitpicky, warnings are errors. Executed outputs
# still come from the (correctly invalidated) cache.
book-strict: venv
	$(call build_book,--all -n -W --keep-going)

# The whole book as one PDF: the single-page build (same execution cache) paginated by Paged.js
# (vendored in scripts/pdf/) in headless Chromium: contents with page numbers, running headers,
# bookmarks, solutions at each chapter's end, every link internal or a public URL.
pdf: book
	$(PY) scripts/build_pdf.py

# --- checks ---------------------------------------------------------------------------------
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@# every citation carries its text for JupyterLab (scripts/jupyterlab_citations.py)
	$(PY) scripts/jupyterlab_citations.py --check

strip-check: venv
	$(BIN)/nbstripout --verify $(NOTEBOOKS)

# The unit tests, less the trained claims: those run in `claims-ci` under two variants that
# stand for other processors (the chapters themselves assert them as is, under nbmake).
unit: venv
	OMP_NUM_THREADS=1 $(BIN)/pytest tests/ -q -m "not trained" -n $(JOBS) --durations=10

# Trained outcomes are chaotic at float rounding, so every claim the book makes from training
# (tests marked `trained`) must hold under every variant of scripts/claims.py: initial weights
# x (1 +- 1e-7), one thread, ATEN_CPU_CAPABILITY=default, other seeds. `make claims` runs all
# six and prints the table; `make test` runs two of them (two at a time, one thread each).
CLAIMS_ARGS ?=
claims: venv
	$(PY) scripts/claims.py --jobs $(JOBS) $(CLAIMS_ARGS)

claims-ci: venv
	$(PY) scripts/claims.py --jobs $(JOBS) --variants "jitter +1e-7" "ATen default"

# Every chapter under nbmake, JOBS at a time, each kernel on one thread; each one that runs
# without error is also stored in the book's execution cache, where the book build finds it
# (scripts/nbmake_cache.py). The book then shows one-thread outputs: every trained claim holds
# on one thread too (`make claims`).
notebooks: venv
	$(call fresh_cache)
	OMP_NUM_THREADS=1 PYTHONPATH=scripts $(BIN)/pytest -p nbmake_cache \
		--nb-cache=_build/.jupyter_cache -n $(JOBS) --dist worksteal \
		--nbmake --nbmake-timeout=900 -q --durations=0 $(NB_ORDER)

# JOBS browsers at a time, each page's checks on one of them (tests/browser/conftest.py)
browser: venv
	$(BIN)/pytest tests/browser -q --browser --ignore=tests/browser/test_pdf.py \
		-n $(JOBS) --dist loadgroup --durations=15

pdf-check: pdf
	$(BIN)/pytest tests/browser/test_pdf.py -q --browser --durations=5

# The PDF (Paged.js, then pypdf: one core) runs beside the trained claims (scripts/stages.py).
test: venv
	@$(PY) scripts/stages.py \
		"lint=$(MAKE) --no-print-directory lint" \
		"nbstripout=$(MAKE) --no-print-directory strip-check" \
		"unit tests=$(MAKE) --no-print-directory unit" \
		"notebooks (nbmake)=$(MAKE) --no-print-directory notebooks" \
		"book (-n -W)=$(MAKE) --no-print-directory book-strict" \
		"pdf=$(MAKE) --no-print-directory pdf-check" \
		"&trained claims (jitter, ATen default)=$(MAKE) --no-print-directory claims-ci" \
		"browser=$(MAKE) --no-print-directory browser"

# --- measurements ---------------------------------------------------------------------------
bench: venv
	@mkdir -p benchmarks/results
	@set -e; for script in $(sort $(wildcard benchmarks/bench_*.py)); do \
		echo "== $$script"; $(PY) $$script $(BENCH_ARGS); \
	done

# Does requirements.txt resolve, wheels only, for macOS arm64, Windows and Linux against
# what PyPI serves? Needs the network (skips cleanly offline), so not part of make test.
install-check: venv
	$(PY) scripts/check_install.py

# The lower bounds pyproject.toml declares, proven: every `>=` floor installed exactly in a
# scratch venv (_build/floors/venv), then the unit tests there (scripts/floors.py). Needs the
# network the first time; not part of make test.
floors: venv
	$(PY) scripts/floors.py $(FLOORS_ARGS)

clean:
	rm -rf _build
