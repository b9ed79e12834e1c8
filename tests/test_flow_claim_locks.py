"""The guards of the claim (durable_claim_v6, PostgreSQL), each through a real claim: a
limited queue's lock waited for and its room counted after it (at READ COMMITTED,
which the store sets for a session at another level); a workflow-wide limit's lock
likewise; a limited key's slots' locks tried, never waited for, and its own lock
tried (exclusive under rate_per_key; shared otherwise, which keeps out a claimer of
the previous release, durable_claim_v5); a key slot committed after the claim read
it free dropped by its last statement; a rate slot begun meanwhile refusing a begin;
and a claim reading about as many keys as it takes, in turns from where the last one
stopped, across every queue it serves. scripts/mutate_claim.py removes each guard in
turn and shows which of these tests catches it.

Each claimer is a thread with its own connection; the one that holds its claim open
does so inside a transaction (the locks are the transaction's), and waits are seen
in pg_locks, never timed."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import django_durable as durable
from django_durable import store
from django_durable.models import FlowRateSlot, FlowTurn, Run, Status
from django_durable.operations.flow import claim_limits
from django_durable.store import FlowLimit
from django_durable.store.engines import postgres
from django_durable.store.functions import CURRENT
from tests.testapp.workflows_flow import OnePerTenant, PerTenant, RatedPerTenant, Turns
from tests.worker_processes import wait_until

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "repeatable"]),
]

LEASE = timedelta(minutes=1)
DEADLINE = 30  # seconds: a claim that has not returned by then is stuck, not slow


def claim(limit: int, queues=("flow",), worker: str = "w", **kwargs) -> list[Run]:
    kwargs.setdefault("flow_limits", claim_limits())  # the declared ones, as a worker's
    return store.claim(worker_id=worker, queues=list(queues), limit=limit, lease=LEASE, **kwargs)


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
    """A claim on its own connection (of ``alias``), its result kept; its backend pid
    known."""

    def __init__(self, call, alias: str = "default"):
        super().__init__(daemon=True)
        self.call = call
        self.alias = alias
        self.claimed: list | None = None
        self.pid: int | None = None
        self.error: BaseException | None = None

    def run(self):
        try:
            connections[self.alias].ensure_connection()
            self.pid = connections[self.alias].connection.info.backend_pid
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
    """Whether backend ``pid`` waits for a lock (seen in pg_locks): an advisory lock,
    or a row's or a transaction's (what a unique index's check waits for)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted)", [pid]
        )
        return cursor.fetchone()[0]


def claim_behind(held_call, waiting_call, alias: str = "default") -> tuple[list, list]:
    """``held_call`` claims in a transaction kept open; ``waiting_call`` claims on its
    own connection, must be seen waiting for a lock (pg_locks) while the first holds
    its locks, and returns once the first commits: what each claimed."""
    held = HeldClaim(held_call)
    held.start()
    assert held.ready.wait(DEADLINE)
    waiting = Claimer(waiting_call, alias)
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


def due(queue: str, count: int, workflow: str = "plain", minutes_ago: int = 0, **fields):
    at = store.now() - timedelta(minutes=minutes_ago)
    for n in range(count):
        Run.objects.create(
            workflow=workflow, queue=queue, due_at=at + timedelta(milliseconds=n), **fields
        )


def at_repeatable_read(thread_claim):
    """``thread_claim`` through the "repeatable" alias (tests/settings.py): a session
    at REPEATABLE READ by the server's default, which the claim must detect itself."""

    def call():
        with override_settings(DURABLE={**settings.DURABLE, "DATABASE": "repeatable"}):
            with connections["repeatable"].cursor() as cursor:
                cursor.execute("SHOW transaction_isolation")
                assert cursor.fetchone()[0] == "repeatable read"
            return thread_claim()

    return call


QUEUE_LIMIT = {"limited": 1}


@pytest.mark.parametrize("level", ["read committed", "repeatable read"])
def test_a_queue_claimer_waits_for_the_queues_lock_and_counts_after_it(level):
    """Guards: the queue's lock waited for, the queue's room counted after it (a new
    statement, at READ COMMITTED, which the store sets when the session's default is
    another level: at REPEATABLE READ the count would read the snapshot taken before
    the wait, and the slot index would refuse the claim). The second claimer, after
    the first committed, sees the limited queue full and fills its claim from the
    other queue: neither its write refused by the slot index, nor its room spent on
    a run it may not claim."""
    due("limited", 2, minutes_ago=10)  # older: claim order takes them first
    due("other", 2)
    second = lambda: claim(2, queues=("limited", "other"), worker="second", limits=QUEUE_LIMIT)  # noqa: E731
    alias = "default"
    if level == "repeatable read":
        second, alias = at_repeatable_read(second), "repeatable"
    first, got = claim_behind(
        lambda: claim(1, queues=("limited",), worker="first", limits=QUEUE_LIMIT), second, alias
    )
    assert [r.queue for r in first] == ["limited"]
    assert sorted(r.queue for r in got) == ["other", "other"]
    assert Run.objects.filter(queue="limited", status=Status.RUNNING).count() == 1


@pytest.mark.django_db(transaction=True, databases=["default", "repeatable"])
def test_the_session_level_is_asked_once_per_connection():
    """The claim reads the session's default level once per connection, not per claim."""
    due("flow", 3)
    with override_settings(DURABLE={**settings.DURABLE, "DATABASE": "repeatable"}):
        repeatable = connections["repeatable"]
        repeatable.close()
        with CaptureQueriesContext(repeatable) as seen:
            for _ in range(3):
                assert len(claim(1)) == 1
    asked = [q for q in seen.captured_queries if "transaction_isolation" in q["sql"]]
    assert len(asked) == 1
    assert sum("READ COMMITTED" in q["sql"] for q in seen.captured_queries) == 3


def test_a_workflow_claimer_waits_for_the_workflows_lock_and_counts_after_it():
    """Guard: a workflow-wide limit's lock waited for, its room counted after it
    (FewAtOnce: 2 at once). The second claimer sees the first one's 2 runs and takes
    only the runs of the other workflow."""
    due("flow", 4, workflow="few_at_once", minutes_ago=10, flow_key="tenant:x")
    due("turns", 2, workflow="turns", flow_key="tenant:y")
    first, got = claim_behind(
        lambda: claim(2, worker="first"),
        lambda: claim(3, queues=("flow", "turns"), worker="second"),
    )
    assert [r.workflow for r in first] == ["few_at_once", "few_at_once"]
    assert sorted(r.workflow for r in got) == ["turns", "turns"]
    assert Run.objects.filter(workflow="few_at_once", status=Status.RUNNING).count() == 2


def test_a_run_of_a_limited_workflow_due_meanwhile_gets_a_slot_or_nothing():
    """Guard: a run is claimed only with a free slot in each of its limited scopes. The
    second claimer waits for FewAtOnce's lock (its runs were due); meanwhile a run of
    another limited workflow ("one_at_once", 1 at once, its slot held) becomes due, so
    the second claimer never locked or counted that workflow: the slot it cannot get
    keeps it from running a second run."""
    due("flow", 4, workflow="few_at_once", minutes_ago=10, flow_key="tenant:x")
    Run.objects.create(
        workflow="one_at_once", queue="flow", status=Status.RUNNING, worker_id="old",
        lease_expires_at=store.now() + LEASE, workflow_slot=0,
    )  # fmt: skip
    limits = {
        "few_at_once": FlowLimit(None, 2, None, None),
        "one_at_once": FlowLimit(None, 1, None, None),
    }
    held = HeldClaim(lambda: claim(2, worker="first", flow_limits=limits))
    held.start()
    assert held.ready.wait(DEADLINE)
    second = Claimer(lambda: claim(3, worker="second", flow_limits=limits))
    try:
        second.start()
        wait_until(
            lambda: second.pid is not None and waits_for_a_lock(second.pid),
            DEADLINE,
            "the second claimer to wait for the workflow's lock",
        )
        due("flow", 1, workflow="one_at_once", minutes_ago=20)
    finally:
        held.release()
    assert second.result() == []
    assert Run.objects.filter(workflow="one_at_once", status=Status.RUNNING).count() == 1


def test_a_claimer_skips_the_key_another_is_claiming_from_without_waiting():
    """Guard: a limited key's lock is tried, never waited for. The first claimer holds
    its key (one per tenant) open; the second takes the other key's run and returns
    while the first's transaction is still open, never blocked on the first's key
    (by its lock, or by the slot index's check of the first's uncommitted slot)."""
    first, got = claimed_beside_a_held_key(OnePerTenant)
    assert [r.flow_key for r in got] == ["tenant:b" if first.flow_key == "tenant:a" else "tenant:a"]
    assert Run.objects.filter(flow_key=first.flow_key, status=Status.PENDING).count() == 1


def claimed_beside_a_held_key(workflow) -> tuple:
    """Two runs of each of two tenants' keys; a first claimer takes one run and holds
    its transaction open while a second claims: the first's run, and what the second
    took, asserting the second returned while the first still held its key."""
    for tenant in ("a", "b"):
        for _ in range(2):
            durable.start(workflow, {"tenant": tenant})
    [first], got = claim_beside(lambda: claim(1, worker="first"))
    return first, got


def claim_beside(held_call, meanwhile=None) -> tuple[list, list]:
    """``held_call`` claims in a transaction kept open (then ``meanwhile`` runs, if
    given); a second claimer claims up to 4 on its own connection and must return
    while the first still holds its locks: what each claimed."""
    held = HeldClaim(held_call)
    held.start()
    assert held.ready.wait(DEADLINE)
    if meanwhile is not None:
        meanwhile()
    second = Claimer(lambda: claim(4, worker="second"))
    try:
        second.start()
        second.join(DEADLINE)
        returned_while_held = not second.is_alive()
    finally:
        held.release()
    got = second.result()
    assert returned_while_held
    return held.claimed, got


def test_a_claimer_skips_a_rate_limited_key_another_is_claiming_from():
    """Guard: a key under rate_per_key is claimed by one claimer at a time (its lock
    tried exclusive): the second claimer never waits for the rate slot the first is
    writing, and takes the other key's run."""
    first, got = claimed_beside_a_held_key(RatedPerTenant)
    assert {r.flow_key for r in got} == {"tenant:b" if first.flow_key == "tenant:a" else "tenant:a"}


def claim_v5(limit: int, worker: str) -> list:
    """A claim by the previous release's function (durable_claim_v5, which a rolling
    deploy's old workers still call), with the arguments the store passes."""
    at = store.now()
    params = {
        "worker_id": worker,
        "limit": limit,
        **postgres.queue_params(["flow"], {}),
        **postgres.workflow_params(None, ()),
        **postgres.lease_params(at, LEASE),
        **postgres.flow_params(claim_limits(), at, connection),
    }
    call = postgres.CLAIM.replace(f"{CURRENT['durable_claim']}(", "durable_claim_v5(")
    with connection.cursor() as cursor:
        cursor.execute(call, params)
        return cursor.fetchall()


def test_a_claimer_skips_the_key_a_claimer_of_the_previous_release_holds():
    """Guard: a limited key's lock is tried shared, so a claim of the previous release
    (durable_claim_v5, which takes it exclusive and picks slots without their locks)
    and one of this release never pick a key's slots at once. The v5 claimer holds
    tenant a's only slot, uncommitted; this claimer takes tenant b's run and returns
    while it is held, never blocked on the slot index's check."""
    for tenant in ("a", "b"):
        for _ in range(2):
            durable.start(OnePerTenant, {"tenant": tenant})
    Run.objects.filter(flow_key="tenant:b").update(due_at=store.now() + timedelta(minutes=1))
    previous, got = claim_beside(
        lambda: claim_v5(1, "previous"),  # then tenant b's runs are made due
        meanwhile=lambda: Run.objects.filter(flow_key="tenant:b").update(due_at=store.now()),
    )
    assert len(previous) == 1
    assert [r.flow_key for r in got] == ["tenant:b"]


def test_a_key_slot_committed_after_the_claim_read_it_free_is_not_taken():
    """Guard: the claim's last statement (a new snapshot) drops a key slot another
    claim committed after this one read it free, and takes nothing for it, instead of
    failing on the slot index. The claimer is held after its pick (its pointer's
    upsert waits for the turn row, which the test holds); meanwhile the key's other
    run commits holding slot 0."""
    [due_run, other] = [durable.start(OnePerTenant, {"tenant": "a"}) for _ in range(2)]
    Run.objects.filter(id=other).update(due_at=store.now() + timedelta(minutes=1))
    FlowTurn.objects.create(queue="flow", flow_key="tenant:a", claimed_at=store.now())
    turn = HeldClaim(lambda: list(FlowTurn.objects.select_for_update().filter(flow_key="tenant:a")))
    turn.start()
    assert turn.ready.wait(DEADLINE)
    claimer = Claimer(lambda: claim(1))
    try:
        claimer.start()
        wait_until(
            lambda: claimer.pid is not None and waits_for_a_lock(claimer.pid),
            DEADLINE,
            "the claimer to wait for the turn row",
        )
        Run.objects.filter(id=other).update(
            status=Status.RUNNING, worker_id="other", flow_slot=0,
            lease_expires_at=store.now() + LEASE, started_at=store.now(),
        )  # fmt: skip
    finally:
        turn.release()
    assert claimer.result() == []
    assert Run.objects.get(id=due_run).status == Status.PENDING
    assert Run.objects.filter(flow_key="tenant:a", status=Status.RUNNING).count() == 1


def test_a_rate_slot_begun_meanwhile_refuses_the_begin():
    """Guard: the rate slot's upsert takes a slot only if its last begin is at least
    ``per`` old. A slot another claimer took after this claim read it free refuses
    (here written by hand between reads: the claim's statement sees it as taken)."""
    durable.start(RatedPerTenant, {"tenant": "r"})
    now = store.now()
    for slot in range(5):  # every slot begun just now
        FlowRateSlot.objects.create(
            workflow="rated_per_tenant", flow_key="tenant:r", slot=slot, begun_at=now
        )
    assert claim(4) == []
    FlowRateSlot.objects.filter(slot=3).update(begun_at=now - timedelta(minutes=1))
    [begun] = claim(4)
    assert FlowRateSlot.objects.get(slot=3).begun_at > now


def test_a_rate_slot_begun_while_the_claim_writes_it_refuses_the_begin():
    """Guard: the rate slot's upsert re-checks the slot's last begin when it writes. The
    claim reads slot 0 free (begun a minute ago; the others just now); a begin by
    another session, written before and committed while the claim waits to write
    that row: the claim's upsert sees the new begin and the run does
    not begin, so the key never has 6 begins within ``per``."""
    run_id = durable.start(RatedPerTenant, {"tenant": "r"})
    now = store.now()
    for slot in range(5):
        FlowRateSlot.objects.create(
            workflow="rated_per_tenant", flow_key="tenant:r", slot=slot,
            begun_at=now - timedelta(minutes=1) if slot == 0 else now,
        )  # fmt: skip
    # Another session begins in slot 0 (it writes the row, uncommitted until released).
    held = HeldClaim(lambda: FlowRateSlot.objects.filter(slot=0).update(begun_at=store.now()))
    held.start()
    assert held.ready.wait(DEADLINE)
    claimer = Claimer(lambda: claim(4))
    try:
        claimer.start()
        wait_until(
            lambda: claimer.pid is not None and waits_for_a_lock(claimer.pid),
            DEADLINE,
            "the claim to wait for slot 0's row",
        )
    finally:
        held.release()
    assert claimer.result() == []
    assert Run.objects.get(id=run_id).status == Status.PENDING


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
