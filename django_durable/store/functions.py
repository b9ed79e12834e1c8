"""The store's PL/pgSQL functions (PostgreSQL): the hot statements a long-lived
connection runs again and again, kept as functions so that each database session
plans them once (a function's statements keep their plans for the session), not at
every call. Each function's text is a named constant in the module of its concern;
this module lists them and installs them.

They are installed by migration 0013 with CREATE OR REPLACE, from the definitions
here: a later change to a function's body comes with a migration that installs
them again (a change of its arguments or result also drops the old one first).
Statements calling them go through Django's cursor like every other statement, and
a function call is one simple statement, so PgBouncer in transaction pooling mode
runs them as it runs the rest.
"""

from __future__ import annotations

from django_durable.store.claims import CLAIM_FUNCTION, NEXT_DUE_AT_FUNCTION
from django_durable.store.steps import RECORD_STEP_FUNCTION

__all__ = ["FUNCTION_NAMES", "install_functions", "uninstall_functions"]

# Each function's name and its CREATE OR REPLACE statement.
FUNCTIONS = {
    "durable_claim": CLAIM_FUNCTION,
    "durable_next_due_at": NEXT_DUE_AT_FUNCTION,
    "durable_record_step": RECORD_STEP_FUNCTION,
}

FUNCTION_NAMES = tuple(FUNCTIONS)


def install_functions(connection) -> None:
    """Create or replace every function on ``connection`` (PostgreSQL only)."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for statement in FUNCTIONS.values():
            cursor.execute(statement)


def uninstall_functions(connection) -> None:
    """Drop every function on ``connection`` (the migration's reverse)."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for name in FUNCTIONS:
            cursor.execute(f"DROP FUNCTION IF EXISTS {name}")
