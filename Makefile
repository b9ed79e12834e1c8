# django-durable: the commands the README names.
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: install test test-sqlite test-postgres demo lint format bench bench-quick migrations-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e ".[test]"

# The whole suite: lint, migrations in sync, then PostgreSQL and SQLite.
test: install
	bash scripts/ensure-postgres.sh
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python manage.py makemigrations --check --dry-run django_durable
	DURABLE_TEST_DB=postgres $(BIN)/pytest -n 2 $(PYTEST_ARGS)
	DURABLE_TEST_DB=sqlite $(BIN)/pytest -n 2 $(PYTEST_ARGS)
	$(MAKE) bench-quick

test-postgres: install
	bash scripts/ensure-postgres.sh
	DURABLE_TEST_DB=postgres $(BIN)/pytest $(PYTEST_ARGS)

test-sqlite: install
	DURABLE_TEST_DB=sqlite $(BIN)/pytest $(PYTEST_ARGS)

# The example project on SQLite: a worker, traffic with duplicates, and the dashboard.
demo: install
	PYTHON=$(BIN)/python bash scripts/demo.sh

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Benchmarks side by side with raw PostgreSQL and the peers (docs/benchmarks.md).
# Peers are measured when installed: pip install -e ".[bench]".
bench: install
	bash scripts/ensure-postgres.sh
	$(BIN)/python bench/run.py $(BENCH_ARGS)

# The smoke test CI runs: N=500, one repeat; checks the benchmark works, asserts no speed.
bench-quick: install
	bash scripts/ensure-postgres.sh
	$(BIN)/python bench/run.py --quick $(BENCH_ARGS)
