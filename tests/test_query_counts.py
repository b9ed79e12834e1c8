"""The start path runs a small, fixed number of queries.

Counts include the transaction's own statements (BEGIN/COMMIT in autocommit,
SAVEPOINT/RELEASE inside the caller's ``atomic()``). On PostgreSQL a start that
creates a due run also sends one ``pg_notify`` to wake idle workers.

    statement                          new   duplicate   KeyTaken   hand-off
    INSERT ... ON CONFLICT DO NOTHING   1        1           1          2
    SELECT the holder                   -        1           1          1
    UPDATE the old holder               -        -           -          1
    INSERT activity                     -        1           1          1
    pg_notify (PostgreSQL)              1        -           -          1
    BEGIN+COMMIT / SAVEPOINT+RELEASE    2        2           2          2
"""

import pytest
from django.db import connection, transaction

import django_durable as durable
from django_durable.testing import drain


def notify() -> int:
    return 1 if connection.vendor == "postgresql" else 0


NEW = 3
DUPLICATE = 5
KEY_TAKEN = 5
HANDOFF = 7


def check_counts(django_assert_num_queries):
    with django_assert_num_queries(NEW + notify()):
        run_id = durable.start("sync_account", {"v": 1}, key="account:7")
    with django_assert_num_queries(DUPLICATE):
        assert durable.start("sync_account", {"v": 2}, key="account:7") == run_id
    with django_assert_num_queries(KEY_TAKEN), pytest.raises(durable.KeyTaken):
        durable.start("sync_account", {"v": 3}, key="account:7", on_duplicate="error")
    drain()
    with django_assert_num_queries(HANDOFF + notify()):
        assert durable.start_detailed("sync_account", {}, key="account:7").outcome == "handed_off"
    with django_assert_num_queries(NEW + notify()):
        durable.start("sync_account", {})  # no key: the same single insert


@pytest.mark.django_db(transaction=True)
def test_query_counts_in_autocommit(django_assert_num_queries):
    check_counts(django_assert_num_queries)


@pytest.mark.django_db(transaction=True)
def test_query_counts_inside_atomic(django_assert_num_queries):
    with transaction.atomic():
        check_counts(django_assert_num_queries)


@pytest.mark.django_db
def test_a_duplicate_costs_the_same_however_many_runs_used_the_key(django_assert_num_queries):
    for _ in range(5):
        durable.start("sync_account", {}, key="account:7")
        drain()
    durable.start("sync_account", {}, key="account:7")
    with django_assert_num_queries(DUPLICATE):
        durable.start("sync_account", {}, key="account:7")
