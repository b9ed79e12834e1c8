"""What ``manage.py durable doctor`` asks the database itself (PostgreSQL only).

Named, read-only statements: the database's clock, the sessions that LISTEN on the
channel, the connection limits, and one NOTIFY sent and waited for on a listening
connection of its own. On SQLite each returns ``None``: there is no server to ask.
"""

from __future__ import annotations

import time
from datetime import datetime

from django_durable.store.base import db, fetchone, is_postgres
from django_durable.store.workers import open_listener

__all__ = ["connection_limits", "database_clock", "listening_sessions", "notify_round_trip"]

# The database's own clock now (not the transaction's start).
DATABASE_CLOCK = "SELECT clock_timestamp()"
# Sessions other than this one whose last statement was a worker's LISTEN.
LISTENING_SESSIONS = (
    "SELECT count(*) FROM pg_stat_activity WHERE query = %s AND pid <> pg_backend_pid()"
)
# How many connections the server allows to non-superusers, and how many are open.
CONNECTION_LIMITS = (
    "SELECT current_setting('max_connections')::int"
    " - current_setting('superuser_reserved_connections')::int,"
    " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
)
SEND_NOTIFY = "SELECT pg_notify(%s, %s)"


def database_clock() -> datetime | None:
    if not is_postgres():
        return None
    return fetchone(DATABASE_CLOCK, [])[0]


def listening_sessions(channel: str) -> int | None:
    """How many sessions LISTEN on ``channel`` (each worker's notifier holds one)."""
    if not is_postgres():
        return None
    return fetchone(LISTENING_SESSIONS, [f"LISTEN {db().ops.quote_name(channel)}"])[0]


def connection_limits() -> tuple[int, int] | None:
    """``(connections allowed, connections open)`` on the server."""
    if not is_postgres():
        return None
    allowed, in_use = fetchone(CONNECTION_LIMITS, [])
    return allowed, in_use


def notify_round_trip(channel: str, payload: str, alias: str, timeout: float) -> bool | None:
    """LISTEN on a connection of its own, NOTIFY, and see it arrive within ``timeout``."""
    if not is_postgres():
        return None
    listener = open_listener(channel, alias)
    try:
        if db().in_atomic_block:
            # This thread's NOTIFY would wait for the caller's commit: send it from the
            # listening connection (in autocommit) instead.
            with listener.connection.cursor() as cursor:
                cursor.execute(SEND_NOTIFY, [channel, payload])
        else:
            fetchone(SEND_NOTIFY, [channel, payload])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for notice in listener.notifies(timeout=max(deadline - time.monotonic(), 0.01)):
                if notice.payload == payload:
                    return True
        return False
    finally:
        listener.close()
