"""on_duplicate="cancel_existing": the newest input wins, starting over."""

import threading
import time

import pytest
from django.db import connection

import django_durable as durable
from django_durable import activity
from django_durable.models import Run, Status
from django_durable.testing import drain
from tests.helpers import fresh, pick_up
from tests.testapp.models import SideEffect
from tests.testapp.workflows import ProcessArticle, Replaceable, gate

pytestmark = pytest.mark.django_db


def test_replaces_a_pending_holder_even_under_reuse_never():
    old = durable.start(Replaceable, {"rev": 7}, key="article:42")
    result = durable.start_detailed(Replaceable, {"rev": 8}, key="article:42")
    assert result.outcome == "cancel_existing"
    assert result.run_id != old
    old_run, new_run = fresh(old), fresh(result.run_id)
    assert old_run.status == Status.CANCELLED
    assert not old_run.holds_key
    assert old_run.key == "article:42"  # the key it was started with stays
    assert old_run.error["replaced_by"] == str(new_run.id)
    assert str(new_run.id) in old_run.error["message"]
    assert new_run.holds_key and new_run.input == {"rev": 8}
    kinds = [(a.kind, a.details.get("outcome")) for a in activity.list()]
    assert ("key_duplicate", "cancel_existing") in kinds
    assert ("key_handed_off", None) in kinds


def test_override_per_call_and_a_finished_kept_holder_raises_key_taken():
    holder = durable.start(ProcessArticle, {"id": 1}, key="article:1")
    drain()
    assert fresh(holder).status == Status.COMPLETED  # after_failure keeps it
    with pytest.raises(durable.KeyTaken) as taken:
        durable.start(ProcessArticle, {"id": 1}, key="article:1", on_duplicate="cancel_existing")
    assert taken.value.holder_id == holder


def test_a_compensating_holder_answers_key_taken():
    holder = durable.start(Replaceable, {}, key="k")
    Run.objects.filter(id=holder).update(status=Status.COMPENSATING, started_at=durable_now())
    with pytest.raises(durable.KeyTaken) as taken:
        durable.start(Replaceable, {}, key="k")
    assert taken.value.holder_id == holder
    assert Run.objects.count() == 1
    assert fresh(holder).status == Status.COMPENSATING


def durable_now():
    from django_durable.store import now

    return now()


@pytest.mark.django_db(transaction=True)
def test_a_running_step_stops_at_its_next_heartbeat_and_no_later_step_runs():
    old = durable.start(Replaceable, {"gate": "replace-me"}, key="doc:1")
    claimed = pick_up(old)
    done = []

    def worker():
        from django_durable.runtime import executor

        try:
            done.append(executor.execute(claimed))
        finally:
            connection.close()

    thread = threading.Thread(target=worker)
    thread.start()
    deadline = time.monotonic() + 10
    while not SideEffect.objects.filter(run_id=old, step="long-start").exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    new = durable.start(Replaceable, {"v": 2}, key="doc:1")
    gate("replace-me").set()
    thread.join(15)
    assert not thread.is_alive()
    steps = set(SideEffect.objects.filter(run_id=old).values_list("step", flat=True))
    assert steps == {"long-start"}  # stopped mid-step; "after" never ran
    assert fresh(old).status == Status.CANCELLED
    assert fresh(old).attempts.get().status == "cancelled"
    assert fresh(new).holds_key


@pytest.mark.django_db(transaction=True)
def test_twelve_racing_cancel_existing_starts_leave_exactly_one_holder():
    first = durable.start(Replaceable, {"n": -1}, key="race")
    barrier = threading.Barrier(12)
    answers, errors = [], []

    def start(n):
        try:
            barrier.wait()
            for _ in range(20):  # KeyContended is documented as safe to retry
                try:
                    answers.append(durable.start(Replaceable, {"n": n}, key="race"))
                    return
                except durable.KeyContended:
                    continue
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=start, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(answers) == 12
    holders = list(Run.objects.filter(key="race", holds_key=True))
    assert len(holders) == 1
    assert holders[0].status == Status.PENDING
    cancelled = Run.objects.filter(key="race", status=Status.CANCELLED)
    assert cancelled.count() == Run.objects.filter(key="race").count() - 1
    assert fresh(first).status == Status.CANCELLED
