"""How claimers share the flow keys (the current durable_claim, PostgreSQL): a
claimer skips a key another claimer is claiming from instead of waiting for it; one
that holds no key waits for the first it skipped and then counts what that claimer
took; a key's running runs are counted on a snapshot taken after its lock; during a
rolling deploy a claimer of a previous release (durable_claim_v2, which serialises on
the workflow's lock, or durable_claim_v3) and one of this release never count at once;
and a claim reads about as many keys as it takes, in turns from where the last one
stopped, across every queue it serves.

Each claimer is a thread with its own connection; the one that holds its claim open
does so inside a transaction (the key locks are the transaction's), and waits are
seen in pg_locks, never timed."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction

import django_durable as durable
from django_durable import store
from django_durable.models import Run, Status
from tests.testapp.workflows_flow import OnePerTenant, PerTenant, Turns
from tests.worker_processes import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

LEASE = timedelta(minutes=1)
DEADLINE = 30  # seconds: a claim that has not returned by then is stuck, not slow


def claim(limit: int, queues=("flow",), worker: str = "w") -> list[Run]:
    return store.claim(worker_id=worker, queues=list(queues), limit=limit, lease=LEASE)


class HeldClaim(threading.Thread):
    """A claim in a transaction its thread keeps open until ``release()``: the locks
    it took are held until then. ``call`` claims on the thread's own connection."""

    def __init__(self, call):
        super().__init__(daemon=True)
        self.call = call
        self.claimed: list = []
        self.pid: int | None = None
        self.ready = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self):
        try:
            with transaction.atomic():
                self.pid = connection.connection.info.backend_pid
                self.claimed = self.call()
                self.ready.set()
                assert self.done.wait(DEADLINE), "never released"
        except BaseException as error:  # reported by the test, not lost in the thread
            self.error = error
            self.ready.set()
        finally:
            connections.close_all()

    def release(self):
        self.done.set()
        self.join(DEADLINE)
        assert not self.is_alive()
        if self.error:
            raise self.error


class Claimer(threading.Thread):
    """A claim on its own connection, its result kept; its backend pid known."""

    def __init__(self, call):
        super().__init__(daemon=True)
        self.call = call
        self.claimed: list | None = None
        self.pid: int | None = None
        self.error: BaseException | None = None

    def run(self):
        try:
            connection.ensure_connection()
            self.pid = connection.connection.info.backend_pid
            self.claimed = self.call()
        except BaseException as error:
            self.error = error
        finally:
            connections.close_all()

    def result(self) -> list:
        self.join(DEADLINE)
        assert not self.is_alive(), "the claim never returned"
        if self.error:
            raise self.error
        return self.claimed


def waits_for_a_lock(pid: int) -> bool:
    """Whether backend ``pid`` waits for an advisory lock (seen in pg_locks)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks"
            " WHERE pid = %s AND locktype = 'advisory' AND NOT granted)",
            [pid],
        )
        return cursor.fetchone()[0]


def test_a_claimer_skips_the_key_another_is_claiming_from_without_waiting():
    for tenant in ("a", "b"):
        for _ in range(2):
            durable.start(Turns, {"tenant": tenant})
    held = HeldClaim(lambda: claim(1, queues=("turns",), worker="first"))
    held.start()
    assert held.ready.wait(DEADLINE)
    [first] = held.claimed
    try:
        # The first claimer still holds its key: the second takes the other key's
        # runs, and returns while the first's transaction is still open.
        second = Claimer(lambda: claim(4, queues=("turns",), worker="second"))
        second.start()
        got = second.result()
    finally:
        held.release()
    assert got and all(r.flow_key != first.flow_key for r in got)
    assert Run.objects.filter(flow_key=first.flow_key, status=Status.PENDING).count() == 1


def claim_behind(held_call, waiting_call) -> tuple[list, list]:
    """``held_call`` claims in a transaction kept open; ``waiting_call`` claims on its
    own connection, must be seen waiting for an advisory lock (pg_locks) while the
    first holds its locks, and returns once the first commits: what each claimed."""
    held = HeldClaim(held_call)
    held.start()
    assert held.ready.wait(DEADLINE)
    waiting = Claimer(waiting_call)
    try:
        waiting.start()
        wait_until(
            lambda: waiting.pid is not None and waits_for_a_lock(waiting.pid),
            DEADLINE,
            "the second claimer to wait for the first's lock",
        )
    finally:
        held.release()
    return held.claimed, waiting.result()


def test_a_claimer_without_a_key_waits_for_the_one_it_skipped_and_counts_its_claims():
    """The only key is held: the second claimer waits for it (it would otherwise come
    back empty while runs are due), and once the first committed it counts that one's
    running run: the key is full."""
    for _ in range(3):
        durable.start(OnePerTenant, {"tenant": "only"})
    first, second = claim_behind(
        lambda: claim(1, worker="first"), lambda: claim(4, worker="second")
    )
    assert len(first) == 1
    assert second == []
    assert Run.objects.filter(flow_key="tenant:only", status=Status.RUNNING).count() == 1


CALL_ARGUMENTS = (
    "(ARRAY['flow'], 4, '{}', '{}', NULL, '{}', 'old-release', interval '1 minute',"
    " ARRAY['one_per_tenant'], ARRAY[1], ARRAY[NULL]::integer[], ARRAY[NULL]::integer[],"
    " ARRAY[NULL]::interval[])"
)


@pytest.mark.parametrize("previous", ["durable_claim_v2", "durable_claim_v3"])
def test_a_previous_release_claimer_and_this_one_never_count_at_once(previous):
    """During a rolling deploy: durable_claim_v2 takes the limited workflow's lock
    exclusive, which this release takes shared; durable_claim_v3 takes each key's
    lock, as this release does. Either way this release's claim waits for the older
    one's commit and then counts the run it claimed: the limit of one per key holds
    across both."""
    for _ in range(2):
        durable.start(OnePerTenant, {"tenant": "mixed"})

    def claim_previous():
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT id FROM {previous}{CALL_ARGUMENTS}")
            return cursor.fetchall()

    old, new = claim_behind(claim_previous, lambda: claim(4, worker="new-release"))
    assert len(old) == 1
    assert new == []
    assert Run.objects.filter(flow_key="tenant:mixed", status=Status.RUNNING).count() == 1


def test_a_key_is_counted_on_a_snapshot_taken_after_its_lock():
    """What the claim in one statement rests on: durable_key_running_v1, called by a
    statement after it waited for a lock, counts the run another claimer committed
    meanwhile, which the statement's own snapshot (taken before the wait) does not
    see. Here the statement waits on an advisory lock the other claimer holds while
    it claims the key's run."""
    durable.start(OnePerTenant, {"tenant": "late"})
    count = (
        "(SELECT count(*) FROM durable_run WHERE flow_key = 'tenant:late'"
        " AND status IN ('running', 'compensating') AND lease_expires_at IS NOT NULL)"
    )

    def lock_and_claim():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended('test.late', 0))")
        return claim(1, worker="first")

    def count_after_the_lock():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT waited.stale, durable_key_running_v1('one_per_tenant', 'tenant:late', 10)"
                f" FROM (SELECT {count} AS stale,"
                " pg_advisory_xact_lock(hashtextextended('test.late', 0)) AS lock"
                " OFFSET 0) AS waited"
            )
            return cursor.fetchone()

    [first], (stale, fresh) = claim_behind(lock_and_claim, count_after_the_lock)
    assert first.flow_key == "tenant:late"
    assert (stale, fresh) == (0, 1)


def index_tuples_read() -> int:
    """Index entries this database's backends have read through the indexes of flow
    keys (durable_run_flow*), with this connection's own reads flushed first
    (statistics are sent at a transaction's end)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT sum(idx_tup_read) FROM pg_stat_user_indexes"
            " WHERE indexrelname LIKE 'durable\\_run\\_flow%%'"
        )
        return cursor.fetchone()[0]


def test_a_claim_reads_about_as_many_keys_as_it_takes_not_every_key():
    """1,000 tenants with runs due: a claim of 4 walks the keys in turns from where
    the previous claim stopped, reading a handful of index entries, where reading
    every key with due runs would read at least 1,000."""
    for tenant in range(1000):
        durable.start(Turns, {"tenant": f"{tenant:04}"})
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_run")
    claim(4, queues=("turns",))  # the session's plans are made: not measured
    before = index_tuples_read()
    got = claim(4, queues=("turns",))
    read = index_tuples_read() - before
    assert len(got) == 4
    assert read < 60, read
    # Turns: the next claim goes on after the keys this one took.
    after = claim(4, queues=("turns",))
    assert min(r.flow_key for r in after) > max(r.flow_key for r in got)


def test_a_claim_of_several_queues_takes_turns_across_them_too():
    for _ in range(4):
        durable.start(PerTenant, {"tenant": "p"})
        durable.start(Turns, {"tenant": "t"})
    got = claim(2, queues=("flow", "turns"))
    assert sorted(r.queue for r in got) == ["flow", "turns"]
