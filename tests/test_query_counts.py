"""The start path runs a small, fixed number of queries.

Counts include the transaction's own statements (BEGIN/COMMIT, SAVEPOINT/RELEASE).
On PostgreSQL one statement, a call of ``durable_start``, inserts the run and sends
the ``pg_notify`` that wakes idle workers, or, when the key is taken, returns its
holder and, for a duplicate the holder answers (``use_existing``, ``error``),
writes its activity row (``store.insert_or_get_holder``). A caller in autocommit
needs no transaction for a new key or for such a duplicate. docs/benchmarks.md
lists the round trips of each path.

    PostgreSQL, autocommit           new   duplicate   KeyTaken   hand-off   no key
    durable_start                     1        1           1          1         1
    hand-off statement                -        -           -          1         -

The hand-off statement releases the finished holder's key, inserts the new run
and writes the activity row, all or nothing (``store.hand_off``). Inside the
caller's ``atomic()`` each start is wrapped in SAVEPOINT/RELEASE. SQLite has no
data-modifying CTE: the holder is a separate SELECT, the activity row a separate
INSERT, a hand-off three statements in a transaction, and there is no NOTIFY.
"""

import pytest
from django.db import connection, transaction

import django_durable as durable
from django_durable.testing import drain


def expected(in_atomic: bool) -> dict[str, int]:
    postgres = connection.vendor == "postgresql"
    # The holder's look after the insert met the key, and the duplicate's activity
    # INSERT: both in the start's one statement on PostgreSQL.
    holder = 0 if postgres else 1
    noted = 0 if postgres else 1
    # A hand-off's release, insert and activity row: one statement on PostgreSQL; on
    # SQLite three, in a transaction (BEGIN/COMMIT, or a savepoint inside one).
    handoff = 1 if postgres else 5
    if in_atomic:
        return {
            "new": 3,
            "duplicate": 3 + holder + noted,
            "key_taken": 3 + holder + noted,
            "handoff": 3 + holder + handoff,
            "no_key": 3,  # the INSERT (which sends the NOTIFY) in a savepoint
        }
    return {
        "new": 1,
        "duplicate": 1 + holder + noted,
        "key_taken": 1 + holder + noted,
        "handoff": 1 + holder + handoff,
        "no_key": 1,
    }


def check_counts(django_assert_num_queries, in_atomic: bool):
    counts = expected(in_atomic)
    with django_assert_num_queries(counts["new"]):
        run_id = durable.start("sync_account", {"v": 1}, key="account:7")
    with django_assert_num_queries(counts["duplicate"]):
        assert durable.start("sync_account", {"v": 2}, key="account:7") == run_id
    with django_assert_num_queries(counts["key_taken"]), pytest.raises(durable.KeyTaken):
        durable.start("sync_account", {"v": 3}, key="account:7", on_duplicate="error")
    drain()
    with django_assert_num_queries(counts["handoff"]):
        assert durable.start_detailed("sync_account", {}, key="account:7").outcome == "handed_off"
    with django_assert_num_queries(counts["no_key"]):
        durable.start("sync_account", {})


@pytest.mark.django_db(transaction=True)
def test_query_counts_in_autocommit(django_assert_num_queries):
    check_counts(django_assert_num_queries, in_atomic=False)


@pytest.mark.django_db(transaction=True)
def test_query_counts_inside_atomic(django_assert_num_queries):
    with transaction.atomic():
        check_counts(django_assert_num_queries, in_atomic=True)


@pytest.mark.django_db
def test_a_duplicate_costs_the_same_however_many_runs_used_the_key(django_assert_num_queries):
    for _ in range(5):
        durable.start("sync_account", {}, key="account:7")
        drain()
    durable.start("sync_account", {}, key="account:7")
    with django_assert_num_queries(expected(in_atomic=True)["duplicate"]):
        durable.start("sync_account", {}, key="account:7")
