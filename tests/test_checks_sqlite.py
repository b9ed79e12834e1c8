"""django_durable.W002: SQLite without IMMEDIATE transactions, and the options it asks
for, which are the quickstart's (step 2) and the example project's."""

import ast

from django_durable.checks import SQLITE_OPTIONS, sqlite_transaction_warnings
from tests import quickstart_project as quickstart

SQLITE = {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3"}
POSTGRES = {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}


def ids(databases):
    return [w.id for w in sqlite_transaction_warnings(databases)]


def test_sqlite_without_immediate_transactions_is_warned():
    assert ids({"default": SQLITE}) == ["django_durable.W002"]
    assert ids({"default": {**SQLITE, "OPTIONS": {"transaction_mode": "DEFERRED"}}}) == [
        "django_durable.W002"
    ]


def test_immediate_sqlite_and_postgres_are_fine():
    assert ids({"default": {**SQLITE, "OPTIONS": {"transaction_mode": "IMMEDIATE"}}}) == []
    assert ids({"default": POSTGRES}) == []


def test_the_hint_gives_the_literal_options_to_add():
    [warning] = sqlite_transaction_warnings({"replica": SQLITE})
    assert "database is locked" in warning.msg
    prefix = 'Add to DATABASES["replica"]: "OPTIONS": '
    assert warning.hint.startswith(prefix), warning.hint
    assert ast.literal_eval(warning.hint.removeprefix(prefix)) == SQLITE_OPTIONS
    assert sqlite_transaction_warnings({"default": {**SQLITE, "OPTIONS": SQLITE_OPTIONS}}) == []


def test_the_hint_says_to_merge_when_the_database_has_options_already():
    [warning] = sqlite_transaction_warnings({"default": {**SQLITE, "OPTIONS": {"timeout": 5}}})
    assert warning.hint.startswith('Add to DATABASES["default"] (merged with the OPTIONS it has)')


def test_the_quickstart_and_the_example_project_use_these_options():
    [block] = [
        b for b in quickstart.blocks() if b.path == "mysite/settings.py" and b.database == "sqlite"
    ]
    namespace = {"DATABASES": {"default": dict(SQLITE)}}
    exec(block.body, namespace)
    assert namespace["DATABASES"]["default"]["OPTIONS"] == SQLITE_OPTIONS
    from example_project.settings import _database

    assert _database(None)["OPTIONS"] == SQLITE_OPTIONS
