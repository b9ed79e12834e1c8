"""Pruning is on by default where a retention is set (issue 32, case 6): a worker
prunes every ``DURABLE["PRUNE_INTERVAL"]`` (an hour unless set; ``None`` turns it
off), one node at a time, on a thread of its own. Old runs are made by moving their
``finished_at`` back in the database, and the next prune by moving its due time:
nothing sleeps through an interval."""

import signal
from datetime import timedelta

import pytest

import django_durable as durable
from django_durable import conf, store
from django_durable.models import Activity, Run
from django_durable.runtime.maintenance import Maintenance
from django_durable.runtime.worker import Worker
from tests.factories import ActivityFactory
from tests.testapp.workflows import Noop
from tests.worker_processes import WorkerPool, wait_until

OLD = timedelta(days=40)  # past the default RUN_RETENTION (30 days)


def finished_long_ago() -> object:
    run_id = durable.start(Noop)
    Run.objects.filter(id=run_id).update(status="completed", finished_at=store.now() - OLD)
    return run_id


def ticked(upkeep: Maintenance) -> Maintenance:
    """One round of chores, and the prune it started (if any) waited for."""
    upkeep.tick()
    if upkeep.pruning is not None:
        upkeep.pruning.join(30)
        assert not upkeep.pruning.is_alive()
    return upkeep


def test_the_default_prune_interval_is_an_hour():
    assert conf.DEFAULTS["PRUNE_INTERVAL"] == timedelta(hours=1)


@pytest.mark.django_db(transaction=True)
def test_a_worker_prunes_by_default_when_a_retention_is_set(settings):
    settings.DURABLE = {}  # RUN_RETENTION: 30 days, PRUNE_INTERVAL: not set
    old = finished_long_ago()
    recent = durable.start(Noop)
    Run.objects.filter(id=recent).update(status="completed", finished_at=store.now())
    ticked(Maintenance(Worker()))
    assert not Run.objects.filter(id=old).exists()
    assert Run.objects.filter(id=recent).exists()


@pytest.mark.django_db(transaction=True)
def test_the_next_prune_comes_one_interval_later(settings):
    settings.DURABLE = {"PRUNE_INTERVAL": timedelta(hours=2)}
    upkeep = ticked(Maintenance(Worker()))
    second = finished_long_ago()
    ticked(upkeep)  # within the interval: not yet
    assert Run.objects.filter(id=second).exists()
    assert upkeep.next_prune_at - store.now() > timedelta(hours=1, minutes=59)
    upkeep.next_prune_at = store.now() - timedelta(seconds=1)  # the interval has passed
    ticked(upkeep)
    assert not Run.objects.filter(id=second).exists()
    assert upkeep.next_prune_at > store.now() + timedelta(hours=1)


@pytest.mark.django_db(transaction=True)
def test_prune_interval_none_turns_pruning_off(settings):
    settings.DURABLE = {"PRUNE_INTERVAL": None}
    old = finished_long_ago()
    upkeep = ticked(Maintenance(Worker()))
    assert upkeep.pruning is None
    assert Run.objects.filter(id=old).exists()


@pytest.mark.django_db(transaction=True)
def test_without_any_retention_the_worker_does_not_prune(settings):
    settings.DURABLE = {"RUN_RETENTION": None, "ACTIVITY_RETENTION": None}
    old = finished_long_ago()
    ActivityFactory(created_at=store.now() - OLD)
    upkeep = ticked(Maintenance(Worker()))
    assert upkeep.pruning is None
    assert Run.objects.filter(id=old).exists() and Activity.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_workflows_retention_alone_is_pruned(settings, define):
    """A workflow's ``retention`` turns the worker's pruning on by itself: named
    statuses are pruned without ``RUN_RETENTION`` (API.md §9)."""
    settings.DURABLE = {"RUN_RETENTION": None, "ACTIVITY_RETENTION": None}
    kept = define("kept_a_week", retention={"completed": durable.days(7)})
    old = durable.start(kept)
    Run.objects.filter(id=old).update(status="completed", finished_at=store.now() - OLD)
    other = finished_long_ago()  # Noop names no retention: kept forever
    upkeep = ticked(Maintenance(Worker()))
    assert upkeep.pruning is not None
    assert not Run.objects.filter(id=old).exists()
    assert Run.objects.filter(id=other).exists()


@pytest.mark.django_db(transaction=True)
def test_activity_retention_alone_is_pruned(settings):
    settings.DURABLE = {"RUN_RETENTION": None}
    old = finished_long_ago()
    ActivityFactory(created_at=store.now() - OLD)
    ticked(Maintenance(Worker()))
    assert Run.objects.filter(id=old).exists()  # runs are kept forever
    assert not Activity.objects.exists()  # activity past its 7 days is not


@pytest.mark.django_db(transaction=True)
def test_a_slow_prune_does_not_hold_up_the_other_chores(settings):
    """The prune runs on a thread of its own: a tick that starts it returns, and a
    tick while it is still going starts no second one."""
    settings.DURABLE = {}
    upkeep = Maintenance(Worker())
    upkeep.tick()
    first = upkeep.pruning
    assert first is not None
    upkeep.next_prune_at = store.now() - timedelta(seconds=1)
    upkeep.tick()
    assert upkeep.pruning is first or not first.is_alive()
    ticked(upkeep)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_prunes_with_the_default_settings(tmp_path):
    old = finished_long_ago()
    pool = WorkerPool(tmp_path)
    try:
        worker = pool.start("--worker-id", "pruner")
        wait_until(lambda: not Run.objects.filter(id=old).exists(), 60, "the worker's first prune")
        worker.wait_for_output("pruned 1 finished run(s)")
        assert "pruning every 1 hour (runs kept 30 days)" in worker.output()
        worker.send(signal.SIGTERM)
        assert worker.wait(60) == 0
    finally:
        pool.kill_all()
