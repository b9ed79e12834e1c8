"""The Worker in this process: claim batching, leases and fences, hand-back,
maintenance, timers, and the command's arguments."""

import logging
import threading
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.db.backends.signals import connection_created
from django.test.utils import CaptureQueriesContext

import django_durable as durable
from django_durable import store
from django_durable.models import Run, Schedule, StepAttempt, WorkerNode
from django_durable.runtime import executor
from django_durable.runtime.compensation import lost_step
from django_durable.runtime.context import Context
from django_durable.runtime.maintenance import Maintenance
from django_durable.runtime.worker import (
    CLAIM_AHEAD_BELOW,
    RUNS_AHEAD_PER_THREAD,
    Held,
    Worker,
    WorkerIdInUse,
)
from tests.helpers import DbThread, wait_until_blocked_on_lock
from tests.plans import explain
from tests.testapp.models import SideEffect
from tests.testapp.workflows import Noop, ProcessArticle, WorkerSleeper
from tests.worker_processes import wait_until

LEASE = timedelta(seconds=30)


def expire_lease(run_id):
    Run.objects.filter(id=run_id).update(lease_expires_at=store.now() - timedelta(seconds=1))


def registered(worker: Worker) -> Worker:
    worker._register()
    return worker


@pytest.mark.django_db
def test_free_slots_are_filled_by_one_claim_statement(django_assert_num_queries):
    run_ids = [durable.start(Noop) for _ in range(10)]
    worker = Worker(concurrency=4, worker_id="batcher")
    # A connection's first claim reads its isolation level once (store.claims):
    # the count below is every later claim's.
    Worker(queues=["nothing-here"]).claim_batch(1)
    with django_assert_num_queries(1):
        runs = worker.claim_batch(4)
    assert len(runs) == 4
    assert {r.id for r in runs} <= set(run_ids)
    assert {(r.status, r.worker_id, r.fence) for r in runs} == {("running", "batcher", 1)}
    assert all(r.lease_expires_at > store.now() for r in runs)
    assert Run.objects.filter(status="pending").count() == 6


@pytest.mark.django_db
def test_claims_runs_ahead_only_while_runs_are_short():
    """Quick runs: the next runs of each thread are claimed before it is free, so no
    thread waits for a claim. Slow runs (or none seen yet): only free threads claim,
    so no claimed run waits behind another's step while another worker could run it."""
    for _ in range(20):
        durable.start(Noop)
    worker = Worker(concurrency=4, worker_id="ahead")
    most = 4 * (1 + RUNS_AHEAD_PER_THREAD)
    with worker._lock:
        assert worker._claimable() == 4  # nothing measured yet
        worker._run_seconds = CLAIM_AHEAD_BELOW / 10
        assert worker._claimable() == most
    worker._hand_out(worker.claim_batch(most))
    assert len(worker.held()) == most  # their leases are renewed while they wait
    with worker._lock:
        assert (worker._claimable(), worker._should_claim()) == (0, False)
        worker._ready.popleft()  # a thread took one: not yet worth a claim
        assert (worker._claimable(), worker._should_claim()) == (1, False)
        worker._ready.popleft()  # half the runs ahead taken: claim them again, together
        assert (worker._claimable(), worker._should_claim()) == (2, True)
        worker._ready.clear()  # none waiting: claim at once
        assert (worker._claimable(), worker._should_claim()) == (most, True)
        worker._run_seconds = CLAIM_AHEAD_BELOW * 10
        assert worker._claimable() == 4


@pytest.mark.django_db
def test_claims_only_the_queues_it_serves():
    durable.start(Noop)
    assert Worker(queues=["other"]).claim_batch(4) == []
    assert len(Worker(queues=["other", "default"]).claim_batch(4)) == 1


@pytest.mark.django_db
@pytest.mark.parametrize("queues", [None, ["mail"], ["default", "mail"], ["mail", "x", "default"]])
def test_a_claim_takes_the_oldest_due_runs_of_its_queues(queues):
    """Oldest due first across the queues served, at most ``limit``, never another queue."""
    at = store.now()
    made = {}
    for n, (queue, minutes) in enumerate(
        [("default", 5), ("mail", 4), ("default", 3), ("mail", 2), ("other", 6), ("mail", 1)]
    ):
        run_id = durable.start(Noop, {"n": n})
        Run.objects.filter(id=run_id).update(queue=queue, due_at=at - timedelta(minutes=minutes))
        made[run_id] = (queue, minutes)
    served = [
        (minutes, run_id)
        for run_id, (queue, minutes) in made.items()
        if queues is None or queue in queues
    ]
    oldest_first = [run_id for _minutes, run_id in sorted(served, reverse=True)]

    first = store.claim(worker_id="w", queues=queues, limit=2, lease=timedelta(minutes=1))
    rest = store.claim(worker_id="w", queues=queues, limit=10, lease=timedelta(minutes=1))

    assert [r.id for r in first] == oldest_first[:2]
    assert [r.id for r in rest] == oldest_first[2:]


@pytest.mark.django_db
def test_the_idle_look_ahead_finds_the_next_due_time_of_its_queues():
    at = store.now()
    for queue, minutes in [("default", 9), ("mail", 7), ("mail", 3), ("other", 1)]:
        run_id = durable.start(Noop)
        Run.objects.filter(id=run_id).update(queue=queue, due_at=at + timedelta(minutes=minutes))
    assert store.next_due_at(None) == at + timedelta(minutes=1)
    assert store.next_due_at(["default", "mail"]) == at + timedelta(minutes=3)
    assert store.next_due_at(["default"]) == at + timedelta(minutes=9)
    assert store.next_due_at(["nothing"]) is None


@pytest.mark.django_db
def test_shutdown_hands_back_claimed_runs_and_unregisters():
    keyed = durable.start(ProcessArticle, {"id": 1}, key="article:1")
    durable.start(ProcessArticle, {"id": 2})
    worker = registered(Worker(concurrency=2, worker_id="leaving"))
    worker._hand_out(worker.claim_batch(2))
    assert Run.objects.filter(status="running", worker_id="leaving").count() == 2

    worker._shutdown()

    runs = Run.objects.all()
    assert {(r.status, r.worker_id, r.lease_expires_at, r.fence) for r in runs} == {
        ("pending", None, None, 1)
    }
    assert all(r.due_at <= store.now() for r in runs)
    assert Run.objects.get(id=keyed).holds_key  # handing back never frees a key
    assert WorkerNode.objects.get(id="leaving").stopping  # stopped, shown for a day


@pytest.mark.django_db
def test_a_worker_whose_run_was_recovered_elsewhere_cannot_record():
    run_id = durable.start(Noop)
    (stale,) = store.claim(worker_id="late", queues=None, limit=1, lease=LEASE)
    expire_lease(run_id)
    assert store.recover_expired_leases(3, compensation_step=lost_step).resumed == [run_id]
    (fresh,) = store.claim(worker_id="new-owner", queues=None, limit=1, lease=LEASE)
    assert (stale.fence, fresh.fence) == (1, 2)

    # The late worker comes back and runs the step: none of its writes count.
    executor.execute(stale)
    run = Run.objects.get(id=run_id)
    assert (run.status, run.worker_id, run.step_index, run.fence) == (
        "running",
        "new-owner",
        0,
        2,
    )
    assert (
        not StepAttempt.objects.filter(run_id=run_id, worker_id="late")
        .exclude(status="lost")
        .exists()
    )
    assert not store.hand_back(stale)

    executor.execute(fresh)
    assert Run.objects.get(id=run_id).status == "completed"
    assert set(
        StepAttempt.objects.filter(run_id=run_id, status="completed").values_list(
            "worker_id", flat=True
        )
    ) == {"new-owner"}


@pytest.mark.django_db
def test_the_heartbeat_renews_the_leases_it_holds_in_two_statements(django_assert_num_queries):
    durable.start(Noop)
    durable.start(Noop)
    worker = registered(Worker(concurrency=2, worker_id="beating"))
    worker._hand_out(worker.claim_batch(2))
    Run.objects.update(lease_expires_at=store.now() + timedelta(seconds=1))
    with django_assert_num_queries(2):
        assert worker.heartbeat() == set()
    for run in Run.objects.all():
        assert run.lease_expires_at > store.now() + LEASE - timedelta(seconds=5)


@pytest.mark.django_db
def test_the_heartbeat_flags_a_cancelled_run_and_its_ctx_heartbeat_raises_without_a_query(
    django_assert_num_queries,
):
    run_id = durable.start(Noop)
    other_id = durable.start(Noop)
    worker = registered(Worker(concurrency=2, worker_id="watcher"))
    runs = {r.id: r for r in worker.claim_batch(2)}
    worker._hand_out(list(runs.values()))
    durable.cancel(run_id)

    assert worker.heartbeat() == {run_id}
    assert runs[run_id].lease_lost and not getattr(runs[other_id], "lease_lost", False)
    ctx = Context(runs[run_id], waits=[])
    with django_assert_num_queries(0), pytest.raises(durable.Cancelled):
        ctx.heartbeat()


@pytest.mark.django_db
def test_an_unexpected_error_hands_the_run_back(monkeypatch):
    run_id = durable.start(Noop)
    worker = Worker(worker_id="clumsy")
    (run,) = worker.claim_batch(1)

    def broken(run, **kwargs):
        raise RuntimeError("the worker itself broke")

    monkeypatch.setattr(executor, "execute", broken)
    worker.execute(Held(run, run.fence))
    assert (status_of := Run.objects.get(id=run_id)).status == "pending"
    assert status_of.worker_id is None


@pytest.mark.django_db
def test_a_stopping_worker_runs_no_further_step_and_hands_the_run_back():
    run_id = durable.start(ProcessArticle, {"id": 7})
    worker = Worker(worker_id="stopper")
    (run,) = worker.claim_batch(1)
    # The executor asks before each step: here the worker stops after the first.
    assert executor.execute(run, should_stop=lambda: run.step_index >= 1) == 1
    worker.stop()
    worker.execute(Held(run, run.fence))
    run = Run.objects.get(id=run_id)
    assert (run.status, run.step_index, run.worker_id) == ("pending", 1, None)
    assert list(SideEffect.objects.filter(run_id=run_id).values_list("step", flat=True)) == [
        "fetch"
    ]


# The maintenance tests below run in the test's transaction, which a prune's thread
# (its own connection) would not see: pruning is tested in test_worker_prunes.py.
NO_PRUNING = {"PRUNE_INTERVAL": None}


@pytest.mark.django_db
def test_maintenance_recovers_expired_leases_and_counts_the_attempt(settings):
    settings.DURABLE = NO_PRUNING
    run_id = durable.start(ProcessArticle, {"id": 3}, key="article:3")
    (run,) = store.claim(worker_id="gone", queues=None, limit=1, lease=LEASE)
    expire_lease(run_id)
    Maintenance(Worker(worker_id="alive")).tick()
    run = Run.objects.get(id=run_id)
    assert (run.status, run.attempt, run.worker_id, run.holds_key) == ("pending", 2, None, True)


@pytest.mark.django_db
def test_maintenance_fires_due_schedules(settings):
    settings.DURABLE = NO_PRUNING
    sched = durable.schedule(ProcessArticle, "*/5 * * * *", input={"id": 8}, name="every-5")
    Schedule.objects.filter(pk=sched.pk).update(next_fire_at=store.now() - timedelta(seconds=1))
    upkeep = Maintenance(Worker())
    upkeep.tick()
    upkeep.tick()  # not due again: one run
    assert list(Run.objects.filter(workflow="process_article").values_list("input", flat=True)) == [
        {"id": 8}
    ]


@pytest.mark.django_db
def test_a_second_live_worker_with_the_same_id_is_refused():
    registered(Worker(worker_id="twin"))
    with pytest.raises(WorkerIdInUse):
        registered(Worker(worker_id="twin"))
    WorkerNode.objects.filter(id="twin").update(heartbeat_at=store.now() - timedelta(hours=1))
    registered(Worker(worker_id="twin"))  # a dead one's id can be taken over


def test_bad_worker_arguments_are_refused():
    with pytest.raises(ValueError):
        Worker(concurrency=0)
    with pytest.raises(ValueError):
        Worker(poll_interval=0)


@pytest.mark.parametrize(
    "args",
    [["--concurrency", "0"], ["--poll-interval", "-1"], ["--queues", "a,,b"], ["--worker-id", ""]],
)
def test_the_command_refuses_bad_options(args):
    with pytest.raises(CommandError):
        call_command("durable_worker", *args)


@pytest.mark.django_db
def test_the_command_refuses_the_id_of_a_live_worker():
    registered(Worker(worker_id="busy"))
    package = logging.getLogger("django_durable")
    handlers, level = list(package.handlers), package.level
    try:
        with pytest.raises(CommandError, match="busy"):
            call_command("durable_worker", "--worker-id", "busy")
    finally:
        package.handlers[:] = handlers
        package.setLevel(level)


@pytest.mark.django_db(transaction=True)
def test_a_burst_worker_runs_everything_due_on_its_threads_and_returns_0(caplog):
    run_ids = [durable.start(ProcessArticle, {"id": i}) for i in range(12)]
    caplog.set_level("INFO", logger="django_durable")
    worker = Worker(concurrency=3, burst=True, worker_id="burst")
    assert worker.run(install_signal_handlers=False) == 0
    assert Run.objects.filter(id__in=run_ids, status="completed").count() == 12
    assert worker.runs_executed == 12
    messages = [r.getMessage() for r in caplog.records if r.name == "django_durable.runtime.worker"]
    assert sum("started: step 0" in m for m in messages) == 12
    assert sum(" completed after 2 step(s)" in m for m in messages) == 12
    if connection.vendor == "sqlite":
        assert any("django_durable.W001" in m for m in messages)


@pytest.mark.django_db(transaction=True)
def test_each_thread_keeps_one_connection_for_all_its_runs():
    # CONN_MAX_AGE is 0 in the test settings: still no reconnect per run.
    opened = []

    def count(sender, connection, **kwargs):
        opened.append(threading.current_thread().name)

    run_ids = [durable.start(Noop) for _ in range(30)]
    connection_created.connect(count)
    try:
        assert Worker(concurrency=2, burst=True).run(install_signal_handlers=False) == 0
    finally:
        connection_created.disconnect(count)
    assert Run.objects.filter(id__in=run_ids, status="completed").count() == 30
    # The notifier has two of its own: its LISTEN connection and the thread's, through
    # which it sends itself a NOTIFY to check that its LISTEN works.
    assert opened.count("durable-notifier") <= 2
    others = [name for name in opened if name != "durable-notifier"]
    assert sorted(set(others)) == sorted(others)  # no other thread connected twice
    assert {"durable-slot-0", "durable-slot-1"} <= set(opened)


@pytest.mark.django_db(transaction=True)
def test_a_timer_is_picked_up_when_due_not_at_the_next_poll():
    worker = Worker(worker_id="timers", poll_interval=10)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    run_id = durable.start(WorkerSleeper, {"seconds": 0.5})
    thread.start()
    try:
        wait_until(
            lambda: Run.objects.get(id=run_id).status == "completed", 30, "the sleeper to wake"
        )
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    attempts = StepAttempt.objects.filter(run_id=run_id, step="nap")
    slept = attempts.get(status="suspended").started_at  # the sleep began after this
    woke = attempts.get(status="completed").started_at
    # Not before the timer, and long before the 10 s poll would have found it.
    assert timedelta(seconds=0.5) <= woke - slept < timedelta(seconds=5)


@pytest.mark.postgres
@pytest.mark.django_db
@pytest.mark.parametrize("queues", [None, ["default", "mail"]])
def test_the_claim_and_the_idle_look_ahead_use_the_claim_index(queues):
    durable.start(Noop)
    with CaptureQueriesContext(connection) as captured:
        Worker(queues=queues).claim_batch(4)
        store.next_due_at(queues)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for query in captured.captured_queries:
            plan = explain(query["sql"])
            assert "durable_run_claim" in plan, plan


@pytest.mark.django_db
def test_runs_a_claim_gave_without_its_answer_are_handed_back_before_the_next_claim():
    # A failover at a claim's commit: the runs are this worker's in the database, and
    # the worker never heard of them. Nothing would renew their leases.
    known_id, unknown_id = durable.start(Noop), durable.start(Noop)
    worker = registered(Worker(concurrency=2, worker_id="in-doubt"))
    runs = {run.id: run for run in worker.claim_batch(2)}
    worker._hand_out([runs[known_id]])  # the other claim's answer was lost
    worker._claim_in_doubt = True  # the dispatcher's claim met a connection fault

    worker._hand_back_claims_in_doubt()

    unknown, known = Run.objects.get(id=unknown_id), Run.objects.get(id=known_id)
    assert (unknown.status, unknown.worker_id, unknown.recoveries) == ("pending", None, 0)
    assert not StepAttempt.objects.filter(run_id=unknown_id).exists()  # it never ran
    assert (known.status, known.worker_id) == ("running", "in-doubt")
    assert not worker._claim_in_doubt
    # Another worker's runs are never this worker's to hand back.
    assert store.claims_unknown_to("someone-else", []) == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_run_given_up_in_an_outage_stays_the_workers_while_it_is_handed_back():
    """The heartbeat hands back the runs given up during an outage while the dispatcher
    may look for claims in doubt: a run being handed back is still among what the
    worker holds, so the dispatcher never takes it for one it never heard of (its
    hand-back would drop the lost attempt, and the step would run again unrecorded).
    The hand-back is held on the run's row lock, taken by the test."""
    run_id = durable.start(Noop)
    worker = registered(Worker(concurrency=1, worker_id="outage"))
    [run] = worker.claim_batch(1)
    worker.handbacks._waiting.append(Held(run, run.fence))  # given up in an outage
    locked, release = threading.Event(), threading.Event()

    def lock_the_row():
        with transaction.atomic():
            Run.objects.select_for_update().get(id=run_id)
            locked.set()
            release.wait(30)

    holder, handing = DbThread(lock_the_row), DbThread(worker.return_lost_runs)
    holder.start()
    try:
        assert locked.wait(30)
        handing.start()
        wait_until_blocked_on_lock(handing)
        known = [held.run.id for held in worker.held()]
        assert run_id in known
        assert store.claims_unknown_to(worker.worker_id, known) == []
    finally:
        release.set()
        holder.outcome()
    handing.outcome()
    assert worker.held() == []
    assert Run.objects.get(id=run_id).status == "pending"
