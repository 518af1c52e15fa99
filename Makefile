# The two set-up commands: `make run` and `make test`. Both work on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ADMIN_EMAIL ?= admin@localhost
ADMIN_PASSWORD ?=
PYTEST_ARGS ?=

.PHONY: run test lint bench install clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/.installed

# venv, install, embedded PostgreSQL (unless DATABASE_URL is set), migrate, bootstrap, serve.
run: install
	@mkdir -p var
	@if [ ! -s var/admin-token ]; then \
		$(BIN)/switchboard bootstrap --email $(ADMIN_EMAIL) $(if $(ADMIN_PASSWORD),--password '$(ADMIN_PASSWORD)') > var/admin-token.tmp \
		&& mv var/admin-token.tmp var/admin-token \
		&& echo "First admin $(ADMIN_EMAIL); API token (kept in var/admin-token): $$(cat var/admin-token)"; \
	fi
	$(BIN)/switchboard serve

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy switchboard app.py wsgi.py

# The whole suite: gates, then pytest (embedded PostgreSQL unless TEST_DATABASE_URL is set).
test: lint
	$(BIN)/pytest -q $(PYTEST_ARGS)

# The performance report, one table from one run: claim path (store vs raw SQL, budgets,
# 1M pending, sustained), CPU per claim, MCP over HTTP, memory (docs/PERFORMANCE.md).
bench: install
	$(BIN)/python -m bench.claim

# Load test (bench/soak.py): 50 agents over MCP through gunicorn for 60 s, draining budgeted and
# open queues while creators add work, a worker killed and PostgreSQL restarted mid-run.
.PHONY: soak
soak: install
	$(BIN)/python -m bench.soak

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
