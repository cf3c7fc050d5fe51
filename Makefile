# dockflow: `make run` starts the service with the embedded MongoDB and a demo tenant;
# `make test` runs ruff, mypy and the whole test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint proto clean browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/dockflow serve --demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy core edge public_api webhooks dockflow bench tests

# Debian's Chromium for the dashboard's browser tests; without it (no root, no network) those
# tests skip and say why.
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update && apt-get install -y chromium) || true

test: lint browser
	$(BIN)/pytest

proto: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m dockflow.protogen

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
