"""Which writes wait for the WAL flush (``ASYNC_DUPLICATE_RECORDS``).

A trigger records ``synchronous_commit`` as each row goes in: the value the
transaction will commit with. A duplicate that only answers, started outside a
transaction, is the one write allowed to skip the flush; a new run never is, and
the setting never outlives the statement.
"""

import pytest
from django.db import connection, transaction

import django_durable as durable
from tests.testapp.workflows import SyncAccount

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def commit_modes():
    """Rows of (table, synchronous_commit) for every run and activity row inserted."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE test_commit_modes (tbl text, mode text)")
        cursor.execute(
            "CREATE FUNCTION test_commit_mode() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO test_commit_modes VALUES (TG_TABLE_NAME, "
            "current_setting('synchronous_commit')); RETURN NULL; END $$"
        )
        for table in ("durable_run", "durable_activity"):
            cursor.execute(
                f"CREATE TRIGGER test_commit_mode AFTER INSERT ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION test_commit_mode()"
            )

    def seen():
        with connection.cursor() as cursor:
            cursor.execute("SELECT tbl, mode FROM test_commit_modes")
            rows = cursor.fetchall()
            cursor.execute("DELETE FROM test_commit_modes")
        return rows

    yield seen
    with connection.cursor() as cursor:
        for table in ("durable_run", "durable_activity"):
            cursor.execute(f"DROP TRIGGER test_commit_mode ON {table}")
        cursor.execute("DROP FUNCTION test_commit_mode()")
        cursor.execute("DROP TABLE test_commit_modes")


def setting() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return cursor.fetchone()[0]


@pytest.mark.parametrize("on_duplicate", ["use_existing", "error"])
def test_an_answered_duplicate_outside_a_transaction_skips_the_flush(commit_modes, on_duplicate):
    holder = durable.start(SyncAccount, {"n": 1}, key="acct:1")
    assert commit_modes() == [("durable_run", "on")]

    if on_duplicate == "error":
        with pytest.raises(durable.KeyTaken):
            durable.start(SyncAccount, {"n": 2}, key="acct:1", on_duplicate="error")
    else:
        assert durable.start(SyncAccount, {"n": 2}, key="acct:1") == holder
    assert commit_modes() == [("durable_activity", "off")]
    assert setting() == "on"  # local to the statement's own transaction

    durable.start(SyncAccount, {"n": 3}, key="acct:2")
    assert commit_modes() == [("durable_run", "on")]


def test_turned_off_every_duplicate_waits_for_the_flush(commit_modes, settings):
    settings.DURABLE = {"ASYNC_DUPLICATE_RECORDS": False}
    holder = durable.start(SyncAccount, {"n": 1}, key="acct:1")
    assert durable.start(SyncAccount, {"n": 2}, key="acct:1") == holder
    assert commit_modes() == [("durable_run", "on"), ("durable_activity", "on")]


def test_inside_the_callers_transaction_nothing_changes_how_it_commits(commit_modes):
    holder = durable.start(SyncAccount, {"n": 1}, key="acct:1")
    with transaction.atomic():
        assert durable.start(SyncAccount, {"n": 2}, key="acct:1") == holder
        assert setting() == "on"
    assert commit_modes() == [("durable_run", "on"), ("durable_activity", "on")]
