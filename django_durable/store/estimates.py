"""Row counts from PostgreSQL's planner statistics, for pages that must not count.

Counting the runs table by status reads every row (0.6 s and more at a million
runs); the statistics ANALYZE keeps (``pg_class.reltuples`` and the most common
values of ``status`` in ``pg_stats``) answer in a millisecond. They are
estimates, as fresh as the last (auto)ANALYZE, and the dashboard says so.
"""

from __future__ import annotations

from django_durable.store.base import db, engine, fetchone

__all__ = ["status_estimates"]


def status_estimates() -> dict[str, int] | None:
    """Estimated runs per status on PostgreSQL; None where there are no statistics
    (SQLite, or a table never analysed): the caller counts instead."""
    connection = db()
    statement = engine(connection).STATUS_ESTIMATES
    if statement is None:
        return None
    row = fetchone(statement, [], connection)
    if row is None or row[0] is None or row[0] < 0 or row[1] is None:
        return None
    total, values, freqs = row
    return {value: round(total * freq) for value, freq in zip(values, freqs, strict=True)}
