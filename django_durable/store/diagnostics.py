"""What ``manage.py durable doctor`` asks the database itself.

The engine's read-only statements: the database's clock, the sessions that LISTEN
on the channel, the connection limits, and one NOTIFY sent and waited for on a
listening connection of its own. Where the engine has none (SQLite) each returns
``None``: there is no server to ask. And, on every database, the names of the
indexes and constraints its tables have (Django's introspection).
"""

from __future__ import annotations

import time
from datetime import datetime

from django_durable.store.base import db, engine, fetchone
from django_durable.store.functions import outdated_functions
from django_durable.store.workers import listen_statement, open_listener

__all__ = [
    "connection_limits",
    "database_clock",
    "index_names",
    "listening_sessions",
    "notify_round_trip",
    "outdated_functions",
]


def database_clock() -> datetime | None:
    statement = engine().READ_CLOCK
    if statement is None:
        return None
    return fetchone(statement, [])[0]


def index_names(tables: list[str]) -> set[str]:
    """The names of the indexes and constraints of those of ``tables`` the database
    has, through Django's introspection."""
    connection = db()
    names: set[str] = set()
    with connection.cursor() as cursor:
        present = set(connection.introspection.table_names(cursor))
        for table in tables:
            if table in present:
                names |= set(connection.introspection.get_constraints(cursor, table))
    return names


def listening_sessions(channel: str) -> int | None:
    """How many sessions LISTEN on ``channel`` (each worker's notifier holds one)."""
    connection = db()
    statement = engine(connection).LISTENING_SESSIONS
    if statement is None:
        return None
    return fetchone(statement, [listen_statement(connection, channel)], connection)[0]


def connection_limits() -> tuple[int, int] | None:
    """``(connections allowed, connections open)`` on the server."""
    statement = engine().CONNECTION_LIMITS
    if statement is None:
        return None
    allowed, in_use = fetchone(statement, [])
    return allowed, in_use


def notify_round_trip(channel: str, payload: str, alias: str, timeout: float) -> bool | None:
    """LISTEN on a connection of its own, NOTIFY, and see it arrive within ``timeout``."""
    notify = engine().NOTIFY
    if notify is None:
        return None
    listener = open_listener(channel, alias)
    try:
        if db().in_atomic_block:
            # This thread's NOTIFY would wait for the caller's commit: send it from the
            # listening connection (in autocommit) instead.
            with listener.connection.cursor() as cursor:
                cursor.execute(notify, [channel, payload])
        else:
            fetchone(notify, [channel, payload])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for notice in listener.notifies(timeout=max(deadline - time.monotonic(), 0.01)):
                if notice.payload == payload:
                    return True
        return False
    finally:
        listener.close()
