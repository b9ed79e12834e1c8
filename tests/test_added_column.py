"""A column added to ``durable_run`` by the next release's migration, while this
release's processes run, never breaks their starts, claims or step records.

A PL/pgSQL function that returns a table's row type (``SETOF durable_run``) fails
("structure of query does not match function result type") when a column is added
to the table while it runs.
This happens to a call in flight: the caller's statement reads the function's
result type when it is parsed, then the function's own statements wait for the
``ALTER TABLE``'s lock and, once it commits, return the new row with one more
column than the caller expects. So the store's functions return explicit columns,
ids or scalars; these tests call them while another connection adds a column."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import psycopg
import pytest
from django.db import connection

import django_durable as durable
from django_durable import store
from django_durable.models import Run
from django_durable.store import functions
from django_durable.testing import drain
from tests.schema import ROW_TYPE_CLAIMS
from tests.testapp.workflows import Noop
from tests.worker_processes import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

claim_returns_a_row_type = pytest.mark.xfail(
    functions.CURRENT["durable_claim"] in ROW_TYPE_CLAIMS,
    reason="the current claim returns SETOF durable_run (issue 41 replaces it)",
    strict=True,
)


LEASE = timedelta(seconds=60)


def other_connection(**options) -> psycopg.Connection:
    settings = connection.settings_dict
    return psycopg.connect(
        dbname=settings["NAME"],
        user=settings["USER"],
        host=settings["HOST"],
        port=settings["PORT"] or "5432",
        **options,
    )


WAITING_ON_RUNS = """
SELECT count(*) FROM pg_locks
WHERE NOT granted AND relation = 'durable_run'::regclass AND pid <> pg_backend_pid()
"""


def while_a_column_is_added(before: Callable[[], object], during: Callable[[], object]) -> None:
    """In a thread of its own (one session, as a process has): ``before``, then
    ``during`` while another connection adds a column to durable_run. ``during``'s
    statements are parsed (their result types read) before the ALTER TABLE commits
    and wait for its lock; then it commits. An exception of the thread is raised
    here."""
    outcome: list[BaseException] = []
    prepared, altered = threading.Event(), threading.Event()

    def act():
        try:
            before()
            prepared.set()
            altered.wait(30)
            during()
        except BaseException as exc:  # handed to the test
            outcome.append(exc)
        finally:
            prepared.set()
            connection.close()

    thread = threading.Thread(target=act)
    thread.start()
    with other_connection() as ddl:
        try:
            assert prepared.wait(30)
            ddl.execute("ALTER TABLE durable_run ADD COLUMN next_release integer")
            altered.set()
            waited = wait_until(
                lambda: ddl.execute(WAITING_ON_RUNS).fetchone()[0] or not thread.is_alive(),
                30,
                "the thread to wait behind the ALTER TABLE",
            )
            assert waited is not False or outcome, "the thread never waited for the lock"
        finally:
            altered.set()
            ddl.commit()
            thread.join(30)
    assert not thread.is_alive()
    if outcome:
        raise outcome[0]


@pytest.fixture
def drops_the_column():
    yield
    with other_connection(autocommit=True) as conn:
        conn.execute("ALTER TABLE durable_run DROP COLUMN IF EXISTS next_release")


def test_a_start_in_flight_while_a_column_is_added_completes(drops_the_column):
    taken = []

    def before():  # this session plans the start, as a running process has
        taken.append(durable.start(Noop, {}, key="taken"))

    def during():
        assert durable.start(Noop, {}, key="new") != taken[0]
        assert durable.start(Noop, {}, key="taken") == taken[0]  # the duplicate's path

    while_a_column_is_added(before, during)
    assert Run.objects.filter(key__in=["new", "taken"]).count() == 2


@claim_returns_a_row_type
def test_a_claim_in_flight_while_a_column_is_added_completes(drops_the_column):
    durable.start(Noop, {})
    second = []
    claimed = []

    def before():  # this session plans the claim and the step records
        drain()
        second.append(durable.start(Noop, {}))

    def during():
        claimed.extend(store.claim(worker_id="w", queues=None, limit=1, lease=LEASE))

    while_a_column_is_added(before, during)
    assert [run.id for run in claimed] == second


RETURNS_A_TABLE_ROW = """
SELECT p.proname FROM pg_proc AS p
JOIN pg_type AS t ON t.oid = p.prorettype
JOIN pg_class AS c ON c.oid = t.typrelid
WHERE p.proname = %s AND c.relkind IN ('r', 'p', 'v')
"""


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=claim_returns_a_row_type) if name in ROW_TYPE_CLAIMS else name
        for name in sorted(functions.CURRENT.values())
    ],
)
def test_no_function_the_code_calls_returns_a_tables_row_type(name):
    with connection.cursor() as cursor:
        cursor.execute(RETURNS_A_TABLE_ROW, [name])
        assert cursor.fetchall() == []
