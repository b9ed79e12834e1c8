"""Pruning: finished runs past retention go (freeing keys), active runs stay."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

import django_durable as durable
from django_durable import store
from django_durable.models import Activity, Run, StepAttempt
from django_durable.testing import drain
from tests.testapp.workflows import SendInvoice, SlowRetry, SyncAccount
from tests.testapp.workflows_engine import CallDouble, SlowUndo, WaitForChildForever

pytestmark = pytest.mark.django_db


def age(run_ids, days=40):
    Run.objects.filter(id__in=run_ids).update(finished_at=store.now() - timedelta(days=days))


def test_a_pruned_holder_frees_its_key():
    first = durable.start(SendInvoice, {"id": 1}, key="inv:1")  # reuse="never"
    drain()
    with pytest.raises(durable.KeyTaken):
        durable.start(SendInvoice, {"id": 1}, key="inv:1")
    age([first])
    assert durable.prune() == 1
    assert not Run.objects.filter(id=first).exists()
    assert not StepAttempt.objects.filter(run_id=first).exists()
    second = durable.start(SendInvoice, {"id": 1}, key="inv:1")
    assert second != first and durable.get_run(second).holds_key


def test_recent_runs_are_kept_until_older_than():
    run_id = durable.start(SyncAccount, {}, key="acct:1")
    drain()
    assert durable.prune() == 0  # 30 days by default
    assert durable.prune(older_than=timedelta(0)) == 1
    assert not Run.objects.filter(id=run_id).exists()


def test_active_runs_are_never_pruned():
    pending = durable.start(SyncAccount, {}, key="acct:2")
    retrying = durable.start(SlowRetry, key="slow:1")  # pending between attempts
    compensating = durable.start(SlowUndo, key="undo:1")
    drain()
    Run.objects.filter(id=pending).update(status="pending", finished_at=None)
    statuses = dict(Run.objects.values_list("id", "status"))
    assert statuses[retrying] == "pending" and statuses[compensating] == "compensating"
    # Even with a finished_at far in the past, an active run is not touched.
    Run.objects.update(finished_at=store.now() - timedelta(days=400))
    assert durable.prune(older_than=timedelta(0)) == 0
    assert Run.objects.count() == 3
    assert durable.get_run(compensating).holds_key


def test_children_are_pruned_with_their_parent_and_never_alone():
    parent = durable.start(CallDouble, {"n": 1})
    drain()
    [child] = Run.objects.filter(parent_id=parent)
    assert child.status == "completed"
    # The child is old, the parent isn't: nothing goes.
    age([child.id])
    assert durable.prune() == 0
    assert Run.objects.filter(id=child.id).exists()
    age([parent])
    assert durable.prune() == 2  # children count
    assert not Run.objects.filter(id__in=[parent, child.id]).exists()


def test_a_finished_parent_with_a_child_still_going_stays():
    parent = durable.start(WaitForChildForever)
    drain()
    [child] = Run.objects.filter(parent_id=parent)
    # The parent ended without cancelling a child (as if compensating elsewhere).
    Run.objects.filter(id=parent).update(status="failed", finished_at=store.now())
    Run.objects.filter(id=child.id).update(status="compensating")
    age([parent])
    assert durable.prune() == 0
    assert Run.objects.filter(id=parent).exists()


def test_a_pruned_holder_hands_its_key_to_the_run_waiting_behind_it():
    holder = durable.start(SyncAccount, {}, key="acct:3")
    Run.objects.filter(id=holder).update(status="running", started_at=store.now())
    waiting = durable.start(SyncAccount, {"v": 2}, key="acct:3", on_duplicate="run_again")
    assert waiting != holder
    # The holder finished but the hand-on hasn't happened yet (its worker died).
    Run.objects.filter(id=holder).update(status="completed", finished_at=store.now())
    age([holder])
    assert durable.prune() == 1
    run = durable.get_run(waiting)
    assert run.holds_key and run.status == "pending" and run.due_at is not None
    drain()
    assert durable.get_run(waiting).status == "completed"


def test_a_holder_a_run_waits_behind_is_not_pruned_before_the_hand_on():
    holder = durable.start(SyncAccount, {}, key="acct:4")
    Run.objects.filter(id=holder).update(status="running", started_at=store.now())
    waiting = durable.start(SyncAccount, {"v": 2}, key="acct:4", on_duplicate="run_again")
    Run.objects.filter(id=holder).update(status="completed", finished_at=store.now())
    age([holder])
    # The store alone (no hand-on first) leaves the holder for the sweep.
    assert store.prune_runs(store.now(), 100) == 0
    assert durable.get_run(waiting).runs_after_id == holder


def test_pruning_goes_in_batches(settings):
    settings.DURABLE = {"PRUNE_BATCH_SIZE": 2}
    ids = [durable.start(SyncAccount, {}, key=f"acct:b{i}") for i in range(5)]
    drain()
    age(ids)
    with CaptureQueriesContext(connection) as queries:
        assert durable.prune() == 5
    run_deletes = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith("DELETE") and '"durable_run"' in q["sql"]
    ]
    assert len(run_deletes) == 3  # 2 + 2 + 1, each in its own short transaction
    assert Run.objects.count() == 0


def test_activity_past_its_retention_is_pruned(settings):
    settings.DURABLE = {"ACTIVITY_RETENTION": timedelta(days=7), "RUN_RETENTION": None}
    holder = durable.start(SyncAccount, {}, key="acct:4")
    durable.start(SyncAccount, {}, key="acct:4")  # a key_duplicate activity
    durable.start(SyncAccount, {}, key="acct:4")
    assert Activity.objects.count() == 2
    old = Activity.objects.order_by("id").first()
    Activity.objects.filter(id=old.id).update(created_at=store.now() - timedelta(days=8))
    assert durable.prune() == 0  # RUN_RETENTION None keeps runs forever
    assert list(Activity.objects.values_list("id", flat=True)) != [old.id]
    assert Activity.objects.count() == 1
    assert Run.objects.filter(id=holder).exists()


def test_durable_prune_command(capsys):
    run_id = durable.start(SyncAccount, {}, key="acct:5")
    drain()
    call_command("durable_prune", "--older-than", "0s", "--dry-run")
    assert "1 finished runs would be pruned" in capsys.readouterr().out
    assert Run.objects.filter(id=run_id).exists()
    call_command("durable_prune", "--older-than", "30d")
    assert "pruned 0" in capsys.readouterr().out
    call_command("durable_prune", "--older-than", "0s")
    assert "pruned 1" in capsys.readouterr().out
    assert not Run.objects.filter(id=run_id).exists()
