"""django_durable.W002: SQLite without IMMEDIATE transactions."""

from django_durable.checks import sqlite_transaction_warnings

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
