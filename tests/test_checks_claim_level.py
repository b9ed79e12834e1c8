"""The system check on the claim's isolation level (django_durable.I001): a
PostgreSQL alias at another level than READ COMMITTED is told that the worker sets
READ COMMITTED for its claim and that the limits hold at any level by the slot
indexes; READ COMMITTED, no level and SQLite say nothing."""

from psycopg import IsolationLevel

from django_durable.checks import claim_level_notes

PG = "django.db.backends.postgresql"


def test_an_alias_at_repeatable_read_or_serializable_is_told_what_the_worker_sets():
    databases = {
        "default": {"ENGINE": PG, "OPTIONS": {"isolation_level": IsolationLevel.REPEATABLE_READ}},
        "other": {"ENGINE": PG, "OPTIONS": {"isolation_level": IsolationLevel.SERIALIZABLE}},
    }
    notes = claim_level_notes(databases)
    assert [n.id for n in notes] == ["django_durable.I001"] * 2
    assert "REPEATABLE READ" in notes[0].msg and "SERIALIZABLE" in notes[1].msg
    assert all("sets READ COMMITTED for its claim" in n.msg for n in notes)
    assert all("slot indexes" in n.msg for n in notes)


def test_read_committed_no_level_and_sqlite_say_nothing():
    databases = {
        "rc": {"ENGINE": PG, "OPTIONS": {"isolation_level": IsolationLevel.READ_COMMITTED}},
        "plain": {"ENGINE": PG},
        "lite": {"ENGINE": "django.db.backends.sqlite3", "OPTIONS": {"isolation_level": 3}},
    }
    assert claim_level_notes(databases) == []
