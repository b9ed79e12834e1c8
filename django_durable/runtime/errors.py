"""How an exception is kept in a run's or an attempt's ``error``, and which
exceptions are the infrastructure's rather than the step's.

A lost database connection (the server restarted or failed over, the backend was
terminated, the network dropped, the session landed on a standby) during a step is
not the step's failure, wherever it surfaced: in the step's own query, at the
COMMIT of its own ``transaction.atomic()``, or while its outcome was recorded. The
run is handed back to run again as soon as the database answers, and it does not
count against ``DURABLE["MAX_RECOVERIES"]`` (``store.hand_back_lost``): an outage
is not the run's fault.
"""

from __future__ import annotations

import traceback
from typing import Any

from django.db import DatabaseError

from django_durable import store
from django_durable.workflows.values import check_text

# The end of a traceback is the part that says where it failed.
TRACEBACK_CHARS = 8000

# PostgreSQL error codes that mean "this session is on the wrong server or the server
# went away", whatever exception class psycopg gives them: class 08 (connection
# exception, by prefix below); the server shutting down, crashed or not accepting
# connections yet, "the database system is in recovery mode" included (57P01-57P03);
# a write on a standby, or on a primary just demoted (25006 read_only_sql_transaction:
# libpq's default target_session_attrs=any may land there).
CONNECTION_SQLSTATES = ("57P01", "57P02", "57P03", "25006")
# A standby cancelling a query that conflicts with replay (40001 with this text): the
# session is on a standby. A 40001 without it is a serialization failure, the step's.
RECOVERY_CONFLICT = "conflict with recovery"


def _storable(text: str) -> str:
    """``text`` without what no database stores (NUL, lone surrogates), escaped."""
    try:
        return check_text(text, "error")
    except ValueError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def describe_error(exc: BaseException) -> dict[str, Any]:
    return {
        "type": type(exc).__name__,
        "message": _storable(str(exc)),
        "traceback": _storable("".join(traceback.format_exception(exc))[-TRACEBACK_CHARS:]),
    }


def _chain(exc: BaseException):
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen and len(seen) < 10:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_read_only(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is PostgreSQL refusing a write (25006)."""
    return any(getattr(error, "sqlstate", None) == "25006" for error in _chain(exc))


def is_connection_fault(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is psycopg saying the connection is gone
    or is not on a writable primary: any error of class 08, 57P01-57P03 or 25006, a
    standby's recovery conflict; an ``OperationalError`` with no code (the server
    closed the connection, a connection attempt failed, a pool timed out); or an
    ``InterfaceError`` (the connection is closed). The caller drops the session
    (``store.reset_connection_after_error(drop=True)``): a standby's session still
    works, and only a new connection finds the primary."""
    for error in _chain(exc):
        if not type(error).__module__.startswith("psycopg"):
            continue
        names = {klass.__name__ for klass in type(error).__mro__}
        if "InterfaceError" in names:
            return True
        sqlstate = getattr(error, "sqlstate", None)
        if sqlstate is not None and (sqlstate.startswith("08") or sqlstate in CONNECTION_SQLSTATES):
            return True
        if sqlstate == "40001" and RECOVERY_CONFLICT in str(error):
            return True
        if "OperationalError" in names and sqlstate is None:
            return True
    return False


def step_lost_its_connection(exc: BaseException) -> bool:
    """Is what a step (or a compensation) raised a connection fault? A write refused
    (25006) is one only if django-durable's own session refuses writes too (a
    failover, a standby): a step that writes to a read-only database of its own fails
    like any step."""
    if not is_connection_fault(exc):
        return False
    if not is_read_only(exc):
        return True
    try:
        return store.refuses_writes()
    except DatabaseError:
        return True  # the database is out of reach: the connection's fault either way
