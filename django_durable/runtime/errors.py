"""How an exception is kept in a run's or an attempt's ``error``, and which
exceptions are the infrastructure's rather than the step's.

A lost database connection (the server restarted, the backend was terminated, the
network dropped) during a step is not the step's failure, wherever it surfaced:
in the step's own query, at the COMMIT of its own ``transaction.atomic()``, or
while its outcome was recorded. The run is handed back to run again, counted
against ``DURABLE["MAX_RECOVERIES"]`` (``store.hand_back_lost``).
"""

from __future__ import annotations

import traceback
from typing import Any

from django_durable.workflows.values import check_text

# The end of a traceback is the part that says where it failed.
TRACEBACK_CHARS = 8000

# PostgreSQL error codes of a lost connection: class 08 (connection exception),
# and the server shutting down or not yet accepting connections (57P01-57P03).
CONNECTION_SQLSTATES = ("57P01", "57P02", "57P03")


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


def is_connection_fault(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is psycopg saying the connection is gone:
    an ``OperationalError`` of class 08 or 57P01-57P03 (or with no code: the server
    closed the connection), or an ``InterfaceError`` (the connection is closed)."""
    for error in _chain(exc):
        if not type(error).__module__.startswith("psycopg"):
            continue
        names = {klass.__name__ for klass in type(error).__mro__}
        if "InterfaceError" in names:
            return True
        if "OperationalError" in names:
            sqlstate = getattr(error, "sqlstate", None)
            if sqlstate is None or sqlstate.startswith("08") or sqlstate in CONNECTION_SQLSTATES:
                return True
    return False
