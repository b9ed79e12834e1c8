"""The store's PL/pgSQL functions (PostgreSQL): the hot statements a connection
runs again and again (a start, a claim, a step's record), kept as functions so that
each database session plans them once (a function's statements keep their plans
for the session), not at every call, and so that a start whose key is taken still
takes one round trip. Each function's text is a named constant in the module of its
concern; this module lists them and installs them.

They are installed by migration 0013 with CREATE OR REPLACE, from the definitions
here: a later change to a function's body comes with a migration that installs
them again, and a change of its arguments or result also drops the old one first
(0014, 0016 and 0017 did, for durable_start; 0018 and 0019 changed only its body).
Statements calling them go through Django's cursor like every other statement, and
a function call is one simple statement, so PgBouncer in transaction pooling mode
runs them as it runs the rest.
"""

from __future__ import annotations

import re

from django_durable.store.base import fetchall
from django_durable.store.claims import CLAIM_FUNCTION, NEXT_DUE_AT_FUNCTION
from django_durable.store.starts import START_FUNCTION
from django_durable.store.steps import RECORD_STEP_FUNCTION

__all__ = [
    "FUNCTION_NAMES",
    "install_functions",
    "installing",
    "outdated_functions",
    "replacing",
    "uninstall_functions",
]

# Each function's name and its CREATE OR REPLACE statement.
FUNCTIONS = {
    "durable_start": START_FUNCTION,
    "durable_claim": CLAIM_FUNCTION,
    "durable_next_due_at": NEXT_DUE_AT_FUNCTION,
    "durable_record_step": RECORD_STEP_FUNCTION,
}

FUNCTION_NAMES = tuple(FUNCTIONS)

# The installed bodies of the store's functions (the text between their dollar
# quotes), by name, among the functions the search path finds.
INSTALLED_BODIES = """
SELECT proname, prosrc FROM pg_proc
WHERE proname = ANY (%s) AND pg_function_is_visible(oid)
"""


def _body(statement: str) -> str:
    """The body of a CREATE FUNCTION statement: what PostgreSQL keeps as ``prosrc``."""
    return re.search(r"AS (\$\w+\$)(.*)\1", statement, re.S).group(2)


def outdated_functions() -> dict[str, str]:
    """Each function of the store that its database lacks ("missing") or holds with
    another body than this version's ("out of date"); empty when all are current."""
    installed = dict(fetchall(INSTALLED_BODIES, [list(FUNCTIONS)]))
    outdated = {}
    for name, statement in FUNCTIONS.items():
        if name not in installed:
            outdated[name] = "missing"
        elif installed[name] != _body(statement):
            outdated[name] = "out of date"
    return outdated


def install_functions(connection) -> None:
    """Create or replace every function on ``connection`` (PostgreSQL only)."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for statement in FUNCTIONS.values():
            cursor.execute(statement)


def installing(apps, schema_editor) -> None:
    """A migration's ``RunPython`` that installs every function (PostgreSQL only)."""
    install_functions(schema_editor.connection)


def replacing(earlier: str):
    """A migration's ``RunPython`` that drops a function whose arguments or result
    changed (``earlier``: its ``DROP FUNCTION IF EXISTS`` with the old signature), then
    installs every function (PostgreSQL only)."""

    def install(apps, schema_editor) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        schema_editor.execute(earlier)
        installing(apps, schema_editor)

    return install


def uninstall_functions(connection) -> None:
    """Drop every function on ``connection`` (the migration's reverse)."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for name in FUNCTIONS:
            cursor.execute(f"DROP FUNCTION IF EXISTS {name}")
