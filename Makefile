# dockflow: `make run` starts the service with the embedded MongoDB and a demo tenant;
# `make test` runs ruff, mypy, the layering check (lint-imports) and the whole test suite twice,
# once per embedded engine (lane): nx-27017 (the default) and SecantusDB (secantusd-py, a dev
# dependency, started by the suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Installs come from the lock files (exact versions, hashes); `make lock` refreshes them after a
# change to pyproject.toml's dependencies.
LOCK_RUNTIME := requirements.txt
LOCK_DEV := requirements-dev.txt
UV_COMPILE := pip compile pyproject.toml --universal --python-version 3.11 --generate-hashes \
	--quiet --custom-compile-command "make lock"

.PHONY: run test test-nx test-secantusdb lint proto clean browser lock bytecode

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# uv installs (seconds, where pip took a minute and a half) and compiles the dependencies'
# bytecode, as pip did. pip only bootstraps it, at the version and hashes the dev lock holds for
# it: the awk keeps the lock's `uv==` entry and its `--hash` lines.
UV := $(BIN)/uv
UV_PIP = $(UV) pip $(1) --quiet --python $(BIN)/python
$(UV): $(BIN)/python $(LOCK_DEV)
	awk '/^uv==/ {keep = 1; print; next} keep && /^ +--hash=/ {print; next} {keep = 0}' \
		$(LOCK_DEV) > $(VENV)/uv-lock.txt
	@grep -q -- --hash= $(VENV)/uv-lock.txt || (echo "$(LOCK_DEV) has no hashed uv entry" >&2; exit 1)
	$(BIN)/pip install --quiet --require-hashes --no-deps -r $(VENV)/uv-lock.txt
	touch $(UV)

$(STAMP): $(UV) pyproject.toml $(LOCK_DEV)
	$(call UV_PIP,install) --compile-bytecode --require-hashes --no-deps -r $(LOCK_DEV)
	$(call UV_PIP,install) --no-deps -e .
	$(call UV_PIP,check)
	touch $(STAMP)

# Only the locked tools (uv) are needed: the project itself may name dependencies the lock
# does not have yet.
lock: $(UV)
	$(UV) $(UV_COMPILE) --output-file $(LOCK_RUNTIME)
	$(UV) $(UV_COMPILE) --extra dev --output-file $(LOCK_DEV)

# A Python told not to write bytecode (PYTHONDONTWRITEBYTECODE, set on some machines) compiles
# every module it imports at every start, and the suite starts hundreds of processes (dockflow
# parts, embedded servers, commands): a start cost 2.1 s of CPU instead of 1.3 s. The install
# compiles the dependencies; this compiles the checkout, each file checked by its contents' hash
# when imported (an edit in the second of a compile, at the same size, is not missed).
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 --invalidation-mode checked-hash \
		core edge public_api webhooks dockflow bench tests

run: $(STAMP) bytecode
	$(BIN)/dockflow serve --demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy core edge public_api webhooks dockflow bench tests
	$(BIN)/lint-imports --no-logo

# Debian's Chromium for the dashboard's browser tests, and poppler-utils (pdftoppm, pdftotext)
# for the proof of load PDF tests; without them (no root, no network) those tests skip and say why.
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update && apt-get install -y chromium) || true
	@command -v pdftoppm >/dev/null 2>&1 || (apt-get update && apt-get install -y poppler-utils) \
		|| true

# A lane: the whole suite on one embedded engine, which the suite starts on a free loopback port
# (and so do the dockflow processes the tests start); DOCKFLOW_MONGODB_URL is ignored here.
# A lane spreads its tests over LANE_WORKERS processes (pytest-xdist; a process that runs out of
# tests takes half of another's queue), each with its own embedded server; both lanes run at
# once. A test waits on servers, sockets and child processes for about a third of its time, so
# six processes keep two cores busy. Each lane ends with its 25 slowest setups and calls: where
# the suite's time goes, run by run (docs/benchmarks.md, "The test suite's wall time").
# `make test LANE_WORKERS=0 LANE_JOBS=` runs everything in one process per lane, one lane at a time.
# Bytecode may be written during a lane (PYTHONDONTWRITEBYTECODE unset): pytest keeps the test
# modules it rewrote for its assertions only then. `test` collects the suite once before the
# lanes, so that their six processes, which start together, find them kept (a collection costs
# 14 s of CPU without, 6 with); a test module that fails to import stops the run there.
LANE_WORKERS ?= 3
LANE_JOBS ?= -j2 -O
PYTEST_ARGS ?= --durations=25
LANE = env -u DOCKFLOW_MONGODB_URL -u PYTHONDONTWRITEBYTECODE DOCKFLOW_EMBEDDED_ENGINE=$(1) $(BIN)/pytest \
	-n $(LANE_WORKERS) --dist worksteal $(PYTEST_ARGS)

test: lint browser bytecode
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest --collect-only -q -p no:cacheprovider \
		> $(VENV)/collected.txt || (cat $(VENV)/collected.txt; exit 1)
	$(MAKE) --no-print-directory $(LANE_JOBS) test-nx test-secantusdb

test-nx: $(STAMP)
	$(call LANE,nx-27017)

test-secantusdb: $(STAMP)
	$(call LANE,secantusdb)

proto: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m dockflow.protogen

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
