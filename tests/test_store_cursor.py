"""The store's kept, preparing cursor (store.sql_cursor) behaves like Django's cursor
where it matters: errors arrive as Django's exceptions, a broken transaction is
refused, and execute wrappers and the query log see its statements."""

import pytest
from django.db import DatabaseError, ProgrammingError, connection, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from django_durable import store

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def run(sql: str, params=None):
    with store.sql_cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def test_statements_are_prepared_and_answer():
    assert run("SELECT %s::int + 1", [41]) == (42,)
    assert run("SELECT %s::int + 1", [1]) == (2,)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
            ["SELECT $1::int + 1"],
        )
        assert cursor.fetchone() == (1,)


def test_errors_are_djangos_and_leave_autocommit_usable():
    with pytest.raises(ProgrammingError):
        run("SELECT * FROM no_such_table")
    assert run("SELECT 1") == (1,)


def test_a_broken_transaction_is_refused():
    with transaction.atomic():
        with pytest.raises(DatabaseError), transaction.atomic(savepoint=False):
            run("SELECT 1 / %s::int", [0])
        with pytest.raises(TransactionManagementError):
            run("SELECT 1")


def test_wrappers_and_the_query_log_see_the_statements():
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        run("SELECT %s::int", [7])
    assert seen == ["SELECT %s::int"]

    with CaptureQueriesContext(connection) as queries:
        run("SELECT %s::int", [8])
    assert [q["sql"] for q in queries.captured_queries] == ["SELECT 8::int"]
