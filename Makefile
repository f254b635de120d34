# Two commands do everything on a fresh machine:
#   make book   create .venv from requirements.txt, execute every chapter, build the HTML book
#   make test   the same set-up, then every check (lint, notebooks stripped, unit tests,
#               notebooks under nbmake, the book with warnings as errors, the browser check)
# and one more for the measurements:
#   make bench  run every benchmark in benchmarks/ (never part of the tests)

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
CACHE_INPUTS = $(sort $(wildcard companion/*.py)) requirements.txt
CACHE_KEY    := _build/.companion-key
NOTEBOOKS     = $(sort $(wildcard book/*.ipynb))

.PHONY: help venv book book-strict test lint strip-check unit notebooks browser bench clean

help:
	@echo "make book   - set up .venv and build the HTML book (every chapter executed)"
	@echo "make test   - set up .venv and run every check"
	@echo "make bench  - run the benchmarks in benchmarks/ (writes benchmarks/results/)"
	@echo "make clean  - remove _build (keeps .venv)"

# --- set-up ---------------------------------------------------------------------------------
$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@touch $(STAMP)

venv: $(STAMP)

# Clear the notebook execution cache when companion/ or the lock changed since the last
# successful build: correct after a change to the package, and a no-change rebuild stays quick
# (every chapter is served from the cache).
define invalidate_cache
	@key=$$(cat $(CACHE_INPUTS) | sha256sum | cut -d' ' -f1); \
	if [ "$$(cat $(CACHE_KEY) 2>/dev/null)" != "$$key" ] && [ -d _build/.jupyter_cache ]; then \
		echo "companion/ or requirements.txt changed: clearing the notebook execution cache"; \
		rm -rf _build/.jupyter_cache; \
	fi
endef
define record_cache_key
	@mkdir -p _build; cat $(CACHE_INPUTS) | sha256sum | cut -d' ' -f1 > $(CACHE_KEY)
endef

# --- the book -------------------------------------------------------------------------------
book: venv
	$(invalidate_cache)
	$(BIN)/jupyter-book build .
	$(record_cache_key)
	@echo "The book is at $(abspath $(HTML))/index.html"

# The check build: every page re-read (--all), nitpicky, warnings are errors. Executed outputs
# still come from the (correctly invalidated) cache.
book-strict: venv
	$(invalidate_cache)
	$(BIN)/jupyter-book build . --all -n -W --keep-going
	$(record_cache_key)

# --- checks ---------------------------------------------------------------------------------
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

strip-check: venv
	$(BIN)/nbstripout --verify $(NOTEBOOKS)

unit: venv
	$(BIN)/pytest tests/ -q

notebooks: venv
	$(BIN)/pytest --nbmake --nbmake-timeout=300 -q $(NOTEBOOKS)

browser: venv
	$(BIN)/pytest tests/browser -q --browser

test: venv
	@$(PY) scripts/stages.py \
		"lint=$(MAKE) --no-print-directory lint" \
		"nbstripout=$(MAKE) --no-print-directory strip-check" \
		"unit tests=$(MAKE) --no-print-directory unit" \
		"notebooks (nbmake)=$(MAKE) --no-print-directory notebooks" \
		"book (-n -W)=$(MAKE) --no-print-directory book-strict" \
		"browser=$(MAKE) --no-print-directory browser"

# --- measurements ---------------------------------------------------------------------------
bench: venv
	@mkdir -p benchmarks/results
	@set -e; for script in $(sort $(wildcard benchmarks/bench_*.py)); do \
		echo "== $$script"; $(PY) $$script $(BENCH_ARGS); \
	done

clean:
	rm -rf _build
