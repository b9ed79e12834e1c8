# django-durable: the commands the README names.
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
PYTEST_ARGS ?=
# The second interpreter CI runs the SQLite suite on (in its own venv), with Django 6.0
# (which needs Python 3.12+): Python 3.13, pyenv's or the one on PATH. Missing,
# `make test` stops and says so (no silent skip).
VENV313 ?= .venv313
PYTHON313 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3.13) \
	$(shell command -v python3.13 2>/dev/null))

.PHONY: install install-py313 install-demo dist test test-sqlite test-postgres test-py313 demo lint format bench bench-quick migrations-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e ".[test]"

# The sdist and the wheel in dist/, the wheel built from the sdist (so the sdist must
# hold all a build needs), offline with the test extra's setuptools; then checked:
# twine's metadata and README rendering, and what each holds (scripts/check-dist.py).
dist: install
	rm -rf dist
	$(BIN)/python -m build --no-isolation --outdir dist .
	$(BIN)/twine check --strict dist/*
	$(BIN)/python scripts/check-dist.py dist

# The whole suite: lint, migrations in sync, then PostgreSQL and SQLite.
test: install
	bash scripts/ensure-postgres.sh
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python manage.py makemigrations --check --dry-run django_durable
	DURABLE_TEST_DB=postgres $(BIN)/pytest -n 2 $(PYTEST_ARGS)
	DURABLE_TEST_DB=sqlite $(BIN)/pytest -n 2 $(PYTEST_ARGS)
	$(MAKE) test-py313
	$(MAKE) bench-quick

test-postgres: install
	bash scripts/ensure-postgres.sh
	DURABLE_TEST_DB=postgres $(BIN)/pytest $(PYTEST_ARGS)

test-sqlite: install
	DURABLE_TEST_DB=sqlite $(BIN)/pytest $(PYTEST_ARGS)

# The SQLite suite again on Python 3.13 and Django 6.0 (the first runs are on
# $(PYTHON), 3.11 here, with Django 5.2).
$(VENV313)/bin/python:
	@if [ -z "$(PYTHON313)" ] || ! "$(PYTHON313)" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 13))'; then \
		echo "make: Python 3.13 not found: install it (pyenv install 3.13) or set PYTHON313=/path/to/python3.13" >&2; \
		exit 1; \
	fi
	$(PYTHON313) -m venv $(VENV313)
	$(VENV313)/bin/pip install -q --upgrade pip

install-py313: $(VENV313)/bin/python
	$(VENV313)/bin/pip install -q -e ".[test]" "Django>=6.0,<6.1"

test-py313: install-py313
	$(VENV313)/bin/python -c 'import django; assert django.VERSION[:2] == (6, 0), django.__version__'
	DURABLE_TEST_DB=sqlite $(VENV313)/bin/pytest -n 2 $(PYTEST_ARGS)

# The example project on SQLite: a worker, traffic with duplicates, and the dashboard.
# It needs the package alone (Django, croniter, django-filter, django-htmx): not the
# test toolchain. A busy DEMO_PORT (default 8000) stops it before anything is installed.
install-demo: $(BIN)/python
	$(BIN)/pip install -q -e .

demo:
	@PYTHON=$(PYTHON) bash scripts/demo.sh --check-port
	$(MAKE) --no-print-directory install-demo
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
