# Bastion: the few commands a person needs. Everything installs into .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The benchmarks' own environment: Bastion (editable) plus FastMCP to compare with, and profilers.
# fastmcp 4.1.3+ needs a certifi newer than the registry here serves; 4.1.2 installs beside mcp 2.3.
BENCH_VENV := .venv-bench
BENCH_BIN := $(BENCH_VENV)/bin
# The HTTP server stacks bench/http_stack.py compares (bench-only: the package does not depend on them).
BENCH_HTTP_STACKS := httptools uvloop hypercorn granian
HOST ?= 127.0.0.1
PORT ?= 8765

.PHONY: run test tools lint format docs docs-reference docs-screenshots bench bench-cli bench-instructions bench-history conformance interop clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.installed

$(VENV)/.installed-docs: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $@ $(VENV)/.installed

## run: start Bastion over HTTP on $(HOST):$(PORT) (embedded default unless a configuration is found)
run: $(VENV)/.installed
	@echo "bastion is installed in $(BIN), not on your PATH: run it as $(BIN)/bastion, or first: source $(BIN)/activate"
	$(BIN)/bastion serve --transport http --host $(HOST) --port $(PORT)

# Test workers (pytest-xdist): one per core, at most four; `make test WORKERS=0` runs in one process.
WORKERS ?= auto --maxprocesses 4

## test: lint, type-check and run every test on every core (the MCP Inspector test needs the tools below)
test: lint tools
	$(BIN)/pytest -q -n $(WORKERS)

## tools: Node 22, the MCP conformance suite, the MCP Inspector, the npm MCP servers of the interop matrix, Claude Code
## and Codex into .tools/ at pinned versions (tests/tools.py)
tools: $(VENV)/.installed
	$(BIN)/python -m tests.tools

## lint: ruff (lint + format check) and mypy --strict
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check bastion tests bench
	$(BIN)/ruff format --check bastion tests bench
	$(BIN)/mypy

$(BENCH_VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_BIN)/python -m pip install --quiet --upgrade pip
	$(BENCH_BIN)/python -m pip install --quiet -e . 'fastmcp==4.1.2' pyinstrument py-spy $(BENCH_HTTP_STACKS)
	touch $@

## bench: the performance benchmarks in one run of ~10-15 min on 2 cores (latency, CPU profile,
## throughput, HTTP server stacks, scale, approval wake-up, across instances on PostgreSQL when it is installed, and
## the command line's start),
## then bench/results/summary.md: the ratios against their targets. Any failed call or lost ledger row stops it
## (exit 1). `make bench QUICK=1`: a few seconds per bench, to try the pipeline (its figures are not results).
# Every results file of one run carries the same $BENCH_RUN; bench/summary.py combines only those.
bench: export BENCH_RUN := $(shell date -u +%Y%m%dT%H%M%SZ)
bench: $(BENCH_VENV)/.installed
	$(BENCH_BIN)/python -m bench.latency $(if $(QUICK),--calls 200 --warmup 20 --rounds 4)
	$(BENCH_BIN)/python -m bench.profile $(if $(QUICK),--calls 300 --warmup 50)
	$(BENCH_BIN)/python -m bench.throughput $(if $(QUICK),--seconds 2)
	$(BENCH_BIN)/python -m bench.http_stack $(if $(QUICK),--seconds 2)
	$(BENCH_BIN)/python -m bench.scale $(if $(QUICK),--connectors 10 --lists 10)
	$(BENCH_BIN)/python bench/approval_wakeup.py $(if $(QUICK),--decisions 10)
	$(BENCH_BIN)/python -m bench.instances_wakeup $(if $(QUICK),--decisions 10)
	$(BENCH_BIN)/python -m bench.cli_start $(if $(QUICK),--rounds 3)
	$(BENCH_BIN)/python -m bench.summary

## bench-cli: how long `bastion --version` and `bastion ... --help` take, against the interpreter alone and the
## 300 ms target (bench/cli_start.py; ~20 s)
bench-cli: $(BENCH_VENV)/.installed
	$(BENCH_BIN)/python -m bench.cli_start

## bench-instructions: instructions per stdio call of Bastion's process, counted by valgrind (the same in every run,
## unlike CPU time: for changes of a few percent), and of the demo server called directly, for scale; TREES="A B"
## compares checkouts in one run; PARTS=all also counts this checkout without each part of the allow path (or
## PARTS=ledger-writes,redaction: those; bench/without.py), what each costs. Needs valgrind. ~1 min per count.
bench-instructions: $(BENCH_VENV)/.installed
	$(BENCH_BIN)/python -m bench.instructions --direct $(if $(PARTS),--parts $(PARTS)) $(TREES)

## bench-history: the ratios of every committed bench/results/summary.json, oldest first, as a table and a chart per
## ratio in bench/README.md (between its history markers; reads git, runs no bench)
bench-history: $(VENV)/.installed
	$(BIN)/python -m bench.history

## interop: the interop matrix alone (real MCP servers from npm and PyPI behind Bastion; hosts of every transport and
## protocol version in front; express lane on and off; tests/interop/), then its table. `make test` runs it too.
interop: $(VENV)/.installed-dev tools
	$(BIN)/pytest -q -n $(WORKERS) tests/test_interop.py
	$(BIN)/python -m tests.interop.table

## conformance: the official MCP conformance suite through Bastion (Node 22 + suite in .tools/; tests/conformance/)
conformance: $(VENV)/.installed
	$(BIN)/python -m tests.conformance.run

## docs: the documentation site, from docs/ and mkdocs.yml into site/ (git-ignored): the generated reference pages
## are checked against the code first (as tests/test_docs_reference.py does), then `mkdocs build --strict` (warnings are errors)
docs: $(VENV)/.installed-docs
	$(BIN)/python -m bastion.docs_reference --check docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

## docs-reference: write the generated reference pages (configuration, CLI, REST API, error classes, action files)
## under docs/reference/ from the code that defines them; commit what changed
docs-reference: $(VENV)/.installed
	$(BIN)/python -m bastion.docs_reference docs

# The inbox's screenshots in the docs are committed (docs/images/), so `make docs` needs no browser and builds the
# same site on every checkout; after the browser tests have written new ones to tests/artifacts/, this copies them.
DOCS_SCREENSHOTS := inbox inbox-pending-card inbox-grants
## docs-screenshots: copy the inbox screenshots the browser tests left in tests/artifacts/ into docs/images/
docs-screenshots:
	@for name in $(DOCS_SCREENSHOTS); do \
		if [ -f tests/artifacts/$$name.png ]; then cp tests/artifacts/$$name.png docs/images/$$name.png && echo "copied $$name.png"; \
		else echo "tests/artifacts/$$name.png is missing: run tests/test_inbox_browser.py and tests/test_inbox.py first" >&2; exit 1; fi; \
	done

## format: apply ruff's formatting and safe fixes
format: $(VENV)/.installed-dev
	$(BIN)/ruff format bastion tests bench
	$(BIN)/ruff check --fix bastion tests bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis site
