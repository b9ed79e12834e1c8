"""Starts racing on one key from many connections at once."""

import threading

import pytest
from django.db import OperationalError, connection, transaction

import django_durable as durable
from django_durable.models import Activity, Run
from tests.helpers import DbThread, wait_until_blocked_on_lock

RACERS = 16


@pytest.mark.django_db(transaction=True)
def test_sixteen_threads_racing_one_key_get_one_run():
    barrier = threading.Barrier(RACERS)

    def racer(n):
        barrier.wait(30)
        return durable.start_detailed("sync_account", {"racer": n}, key="account:7")

    threads = [DbThread(racer, n) for n in range(RACERS)]
    for thread in threads:
        thread.start()
    results = [thread.outcome(60) for thread in threads]

    assert len({result.run_id for result in results}) == 1
    assert sorted(result.outcome for result in results) == ["started"] + ["use_existing"] * 15
    assert Run.objects.count() == 1
    assert Run.objects.get().holds_key
    assert Activity.objects.filter(kind="key_duplicate").count() == RACERS - 1


@pytest.mark.django_db(transaction=True)
def test_sixteen_threads_racing_with_error_get_one_run_and_fifteen_key_taken():
    barrier = threading.Barrier(RACERS)

    def racer(n):
        barrier.wait(30)
        try:
            return durable.start("send_invoice", {"racer": n}, key="invoice:1")
        except durable.KeyTaken as exc:
            return exc

    threads = [DbThread(racer, n) for n in range(RACERS)]
    for thread in threads:
        thread.start()
    results = [thread.outcome(60) for thread in threads]

    [run_id] = [r for r in results if not isinstance(r, durable.KeyTaken)]
    assert {r.holder_id for r in results if isinstance(r, durable.KeyTaken)} == {run_id}
    assert list(Run.objects.values_list("id", flat=True)) == [run_id]


def hold_open_transaction(started: threading.Event, finish: threading.Event):
    with transaction.atomic():
        run_id = durable.start("sync_account", {}, key="account:7")
        started.set()
        assert finish.wait(30)
    return run_id


def start_in(isolation: str):
    """Start ``account:7`` in a transaction at ``isolation`` whose snapshot is
    taken before the start; return the run id or the database error."""
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
                cursor.execute("SELECT count(*) FROM durable_run")  # takes the snapshot
            return durable.start("sync_account", {}, key="account:7")
    except OperationalError as exc:
        return exc


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
def test_a_racing_start_under_repeatable_read_gets_a_serialization_error(isolation):
    """PostgreSQL refuses an insert that conflicts with a row its snapshot can't see.
    The documented answer: retry the transaction, which then finds the holder."""
    from psycopg import errors

    started, finish = threading.Event(), threading.Event()
    first = DbThread(hold_open_transaction, started, finish)
    first.start()
    assert started.wait(30)
    second = DbThread(start_in, isolation)
    second.start()
    wait_until_blocked_on_lock(second)
    finish.set()
    holder = first.outcome()
    error = second.outcome()

    assert isinstance(error, OperationalError)
    assert isinstance(error.__cause__, errors.SerializationFailure)
    assert error.__cause__.sqlstate == "40001"
    assert "could not serialize access" in str(error)
    # Nothing of the failed start remains, and retrying the transaction answers.
    assert list(Run.objects.values_list("id", flat=True)) == [holder]
    assert DbThread(start_in, isolation).outcome_after_start() == holder


@pytest.mark.django_db(transaction=True)
def test_sixteen_threads_racing_to_take_a_finished_holders_key_hand_it_off_once():
    from django_durable.testing import drain

    old = durable.start("sync_account", {}, key="account:7")
    drain()
    barrier = threading.Barrier(RACERS)

    def racer(n):
        barrier.wait(30)
        return durable.start_detailed("sync_account", {"racer": n}, key="account:7")

    threads = [DbThread(racer, n) for n in range(RACERS)]
    for thread in threads:
        thread.start()
    results = [thread.outcome(60) for thread in threads]

    [new] = {result.run_id for result in results}
    assert new != old
    assert sorted(r.outcome for r in results) == ["handed_off"] + ["use_existing"] * 15
    assert list(Run.objects.filter(holds_key=True).values_list("id", flat=True)) == [new]
    assert Activity.objects.filter(kind="key_handed_off").count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_transaction_refused_as_not_serializable_is_run_again_where_it_owns_it():
    """store.retry_deadlocks: an alias at REPEATABLE READ or SERIALIZABLE (workers
    registering together) gets "could not serialize access"; a function that owns its
    transaction runs it again, as after a deadlock."""
    from django.db import connections

    from django_durable import store
    from django_durable.models import WorkerNode

    WorkerNode.objects.create(
        id="w", hostname="h", pid=1, queues=[], concurrency=1,
        started_at=store.now(), heartbeat_at=store.now(),
    )  # fmt: skip
    other = connections.create_connection("default")
    attempts = []

    @store.retry_deadlocks
    def bump():
        attempts.append(1)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursor.execute("SELECT pid FROM durable_worker_node WHERE id = 'w'")  # snapshot
            if len(attempts) == 1:  # another transaction changes the row and commits
                with other.cursor() as theirs:
                    theirs.execute("UPDATE durable_worker_node SET pid = pid + 10 WHERE id = 'w'")
            cursor.execute("UPDATE durable_worker_node SET pid = pid + 1 WHERE id = 'w'")

    try:
        bump()
    finally:
        other.close()
    assert len(attempts) == 2  # refused once (40001), then done
    assert WorkerNode.objects.get(id="w").pid == 12
