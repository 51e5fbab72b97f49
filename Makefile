# Bastion: the few commands a person needs. Everything installs into .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8765

.PHONY: run test lint format bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.installed

## run: start Bastion over HTTP on $(HOST):$(PORT) (embedded default unless a configuration is found)
run: $(VENV)/.installed
	$(BIN)/bastion serve --transport http --host $(HOST) --port $(PORT)

## test: lint, type-check and run every test
test: lint
	$(BIN)/pytest -q

## lint: ruff (lint + format check) and mypy --strict
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check bastion tests bench
	$(BIN)/ruff format --check bastion tests bench
	$(BIN)/mypy

## bench: the benchmarks of DESIGN.md §11 that exist so far; results under bench/results/
bench: $(VENV)/.installed
	$(BIN)/python bench/approval_wakeup.py

## format: apply ruff's formatting and safe fixes
format: $(VENV)/.installed-dev
	$(BIN)/ruff format bastion tests bench
	$(BIN)/ruff check --fix bastion tests bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
