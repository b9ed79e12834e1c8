"""The store's PL/pgSQL functions (PostgreSQL): the hot statements a connection
runs again and again (a start, a claim, its next-due look-up, a step's record, a
stream's write),
kept as functions so that each database session plans them once (a function's
statements keep their plans for the session), and so that a start whose key is
taken still takes one round trip.

Each function's text lives in the migration that creates it, as a file it reads
by name (``django_durable/migrations/sql/<name>_v<N>.sql``), under a versioned
name. A released file is never edited (migrations/RELEASED.json pins it at its
release's tag). A change is a new version beside the old one, created by an expand
migration of the next release, which that release's code calls while the previous
release's processes still call the old one; the old one is dropped by a contract
migration a release later, so at most two versions are installed
(docs/contributing.md). ``CURRENT`` names the version this code calls;
tests/test_migrations.py checks it is the newest a migration creates, and that a
database holds these and no other.

They return explicit columns, ids or scalars, never a table's row type: a column
added to the table later must not break a call in flight (tests/test_added_column.py).

Statements calling them go through Django's cursor like every other statement, and
a call is one simple statement, so PgBouncer in transaction pooling mode runs them
as it runs the rest.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from django_durable.store.base import db
from django_durable.store.engines import for_connection, postgres

__all__ = [
    "CURRENT",
    "definition",
    "install_missing_functions",
    "missing_functions",
    "outdated_functions",
]

# The version of each function this code calls (the names in store/starts.py,
# claims.py and steps.py).
CURRENT = {
    "durable_start": "durable_start_v2",
    "durable_claim": "durable_claim_v6",
    "durable_next_due_at": "durable_next_due_at_v1",
    "durable_record_step": "durable_record_step_v2",
    "durable_stream_write": "durable_stream_write_v1",  # a stream's item (store/streams.py)
    # Called by durable_claim_v6 (and v5), not by the code: its rules of a claimable run and of
    # a run holding a worker, written once. Listed so that a database that lacks them
    # is seen (``durable doctor``) and gets them (``install_missing_functions``).
    "durable_claimable": "durable_claimable_v1",
    "durable_holds_worker": "durable_holds_worker_v1",
}


# Where the migrations keep the functions' text, one file per version.
SQL_DIR = Path(__file__).resolve().parent.parent / "migrations" / "sql"


@functools.cache
def definition(versioned: str) -> str:
    """The CREATE statement of ``versioned`` (``durable_start_v2``), as its migration
    runs it."""
    return (SQL_DIR / f"{versioned}.sql").read_text(encoding="utf-8")


def body(statement: str) -> str:
    """The body of a CREATE FUNCTION statement: what PostgreSQL keeps as ``prosrc``."""
    return re.search(r"AS (\$\w+\$)(.*)\1", statement, re.S).group(2)


def _installed(connection, names: list[str]) -> list[tuple[str, str]]:
    """(name, body) of the functions among ``names`` that ``connection``'s database holds."""
    with connection.cursor() as cursor:
        cursor.execute(postgres.INSTALLED_BODIES, [names])
        return cursor.fetchall()


def outdated_functions() -> dict[str, str] | None:
    """Each function this code calls that its database lacks ("missing") or holds with
    another body than its migration's ("out of date"); empty when all are current;
    None for a database without the store's functions (SQLite)."""
    if for_connection(db()).INSTALLED_BODIES is None:
        return None
    names = list(CURRENT.values())
    installed = dict(_installed(db(), names))
    outdated = {}
    for name in names:
        if name not in installed:
            outdated[name] = "missing"
        elif installed[name] != body(definition(name)):
            outdated[name] = "out of date"
    return outdated


def missing_functions(connection) -> list[str]:
    """The functions this code calls that ``connection``'s database lacks."""
    names = list(CURRENT.values())
    installed = {name for name, _body in _installed(connection, names)}
    return [name for name in names if name not in installed]


def install_missing_functions(connection) -> list[str]:
    """Create the functions this code calls that ``connection``'s database lacks, from
    their migration's text; return their names. For a database whose tables were made
    without migrations (pytest-django's ``--nomigrations``, a test database with
    ``"MIGRATE": False``): apps.py calls it after such a ``migrate``. A function that
    is there is left as it is (the migrations are its history)."""
    missing = missing_functions(connection)
    with connection.cursor() as cursor:
        for name in missing:
            cursor.execute(definition(name))
    return missing


def after_migrate(sender, using, **kwargs) -> None:
    """``post_migrate``: on a PostgreSQL database whose tables for django-durable were
    made without its migrations (``--nomigrations``, ``"TEST": {"MIGRATE": False}``,
    ``MIGRATION_MODULES`` set to None), create the functions this code calls, as its
    migrations would have. With migrations, ``migrate`` made them: nothing to do."""
    from django.db import connections
    from django.db.migrations.loader import MigrationLoader

    connection = connections[using]
    if for_connection(connection).INSTALLED_BODIES is None:
        return  # a database without the store's functions
    module, _explicit = MigrationLoader.migrations_module(sender.label)
    if module is not None:
        return
    if "durable_run" not in connection.introspection.table_names():
        return
    install_missing_functions(connection)
