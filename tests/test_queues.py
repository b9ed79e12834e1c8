"""Start options (run_after, priority, queue) and queues (pause, resume, stats, the
concurrency limit of DURABLE["QUEUES"]), in process; the limit across real worker
processes is in test_queue_limits_processes.py."""

from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_durable as durable
from django_durable import store
from django_durable.models import QueueState, Run, Status
from django_durable.testing import drain
from tests.helpers import LEASE, fresh
from tests.testapp.models import SideEffect
from tests.testapp.workflows_queues import Limited, RunsInOrder, Unlimited

pytestmark = pytest.mark.django_db


def ran_in_order() -> list[str]:
    return list(SideEffect.objects.order_by("id").values_list("note", flat=True))


def make_due(*run_ids) -> None:
    """The controlled clock: the runs' due time moved into the past in the database."""
    Run.objects.filter(id__in=run_ids).update(due_at=timezone.now() - timedelta(seconds=1))


# --- priority -----------------------------------------------------------------------


def test_higher_priority_is_claimed_first_then_the_oldest_due():
    for n, priority in [(1, 0), (2, 5), (3, -1), (4, 5), (5, 0)]:
        durable.start(RunsInOrder, {"n": n}, priority=priority)
    drain()
    assert ran_in_order() == ["2", "4", "1", "5", "3"]


def test_the_workflow_priority_is_the_default(define):
    urgent = define("urgent", priority=10, mark=RunsInOrder.mark)
    low = durable.start(RunsInOrder, {"n": "low"})
    high = durable.start(urgent, {"n": "high"})
    assert (fresh(low).priority, fresh(high).priority) == (0, 10)
    assert durable.start(urgent, {"n": "lower"}, priority=-3) and drain()
    assert ran_in_order() == ["high", "low", "lower"]


def test_a_bad_priority_attribute_fails_at_import(define):
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured):
        define("bad_priority", priority="high")


# --- run_after -------------------------------------------------------------------------


def test_run_after_a_timedelta_is_not_due_before_it():
    run_id = durable.start(RunsInOrder, {"n": 1}, run_after=timedelta(hours=1))
    run = fresh(run_id)
    assert run.status == Status.PENDING
    assert run.due_at > timezone.now() + timedelta(minutes=59)
    assert drain() == 0
    make_due(run_id)
    assert drain() == 1
    assert fresh(run_id).status == Status.COMPLETED


def test_run_after_an_aware_datetime_and_the_key_is_held_while_it_waits(define):
    workflow = define("delayed", timeout=timedelta(minutes=5))
    when = timezone.now() + timedelta(days=1)
    run_id = durable.start(workflow, key="later:1", run_after=when)
    run = fresh(run_id)
    assert (run.due_at, run.holds_key) == (when, True)
    assert run.timeout_at == when + timedelta(minutes=5)  # counted from when it is due
    assert durable.start_detailed(workflow, key="later:1").outcome == "use_existing"


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"run_after": datetime(2030, 1, 1)}, TypeError),  # naive
        ({"run_after": 60}, TypeError),
        ({"run_after": "tomorrow"}, TypeError),
        ({"priority": 1.5}, TypeError),
        ({"priority": True}, TypeError),
        ({"priority": 2**31}, ValueError),
        ({"queue": ""}, ValueError),
        ({"queue": 7}, TypeError),
        ({"queue": "q" * 101}, ValueError),
    ],
    ids=lambda v: repr(v) if not isinstance(v, dict) else "-".join(map(str, v)),
)
def test_bad_start_options_raise_before_anything_is_written(kwargs, error):
    with pytest.raises(error):
        durable.start(RunsInOrder, {"n": 1}, key="opt:1", **kwargs)
    with pytest.raises(error):
        durable.start_detailed(RunsInOrder, **kwargs)
    assert Run.objects.count() == 0


# --- queue -------------------------------------------------------------------------------


def test_queue_overrides_the_workflows_queue():
    run_id = durable.start(RunsInOrder, {"n": 1}, queue="reports")
    assert fresh(run_id).queue == "reports"
    assert drain(queues=["default"]) == 0
    assert drain(queues=["reports"]) == 1


def test_a_paused_queue_is_not_claimed_until_resumed():
    paused = durable.start(RunsInOrder, {"n": "paused"}, queue="reports")
    flowing = durable.start(RunsInOrder, {"n": "flowing"})
    durable.pause_queue("reports")
    durable.pause_queue("reports")  # idempotent
    assert QueueState.objects.get(name="reports").paused
    assert drain() == 1
    assert fresh(paused).status == Status.PENDING
    assert fresh(flowing).status == Status.COMPLETED
    assert store.next_due_at(["reports"]) is None  # an idle worker doesn't wait for it
    durable.resume_queue("reports")
    assert drain() == 1
    assert fresh(paused).status == Status.COMPLETED


def test_pause_and_resume_refuse_a_bad_name():
    for bad in ("", None, 3, "q" * 101):
        with pytest.raises(ValueError):
            durable.pause_queue(bad)
        with pytest.raises(ValueError):
            durable.resume_queue(bad)
    assert QueueState.objects.count() == 0


def test_queue_stats(settings):
    settings.DURABLE = {"QUEUES": {"limited": {"concurrency": 2}}}
    due = [durable.start(RunsInOrder, {"n": n}, queue="reports") for n in range(3)]
    Run.objects.filter(id=due[0]).update(due_at=timezone.now() - timedelta(seconds=30))
    durable.start(RunsInOrder, {"n": 9}, queue="reports", run_after=timedelta(hours=1))
    store.claim(worker_id="stats", queues=["reports"], limit=1, lease=LEASE)  # one running
    durable.pause_queue("idle")

    stats = {row["queue"]: row for row in durable.queue_stats()}
    assert set(stats) == {"reports", "idle", "limited"}
    reports = stats["reports"]
    assert {k: reports[k] for k in ("paused", "pending", "due", "running", "waiting")} == {
        "paused": False,
        "pending": 3,
        "due": 2,
        "running": 1,
        "waiting": 0,
    }
    assert reports["oldest_due_seconds"] < 30  # the oldest due run was the one claimed
    assert stats["idle"]["paused"] and stats["idle"]["pending"] == 0
    assert stats["idle"]["oldest_due_seconds"] is None
    assert stats["limited"]["concurrency"] == 2
    [alone] = durable.queue_stats("reports")
    assert {**alone, "oldest_due_seconds": None} == {**reports, "oldest_due_seconds": None}
    with CaptureQueriesContext(connection) as queries:
        durable.queue_stats()
    assert len(queries) == 2  # however many queues: the counts and the paused queues


# --- concurrency limits ------------------------------------------------------------------


def test_a_limited_queue_is_claimed_only_up_to_its_room(settings):
    settings.DURABLE = {"QUEUES": {"limited": {"concurrency": 2}}}
    limited = [durable.start(Limited, {"n": n}) for n in range(5)]
    others = [durable.start(Unlimited, {"n": n}) for n in range(3)]
    first = store.claim(worker_id="a", queues=None, limit=10, lease=LEASE)
    assert sorted(r.queue for r in first) == ["limited", "limited", "other", "other", "other"]
    # Another worker finds no room left; the limit counts runs whoever holds them.
    assert store.claim(worker_id="b", queues=["limited"], limit=10, lease=LEASE) == []
    # A finished run frees a slot.
    Run.objects.filter(id=first[0].id if first[0].queue == "limited" else limited[0]).update(
        status=Status.COMPLETED, lease_expires_at=None
    )
    again = store.claim(worker_id="b", queues=["limited"], limit=10, lease=LEASE)
    assert len(again) == 1
    assert Run.objects.filter(queue="limited", status=Status.RUNNING).count() == 2
    assert len(others) == 3


def test_drain_honours_the_limit(settings):
    settings.DURABLE = {"QUEUES": {"limited": {"concurrency": 1}}}
    ids = [durable.start(Limited, {"seconds": 0}) for _ in range(3)]
    assert drain() == 3  # one at a time: each claim found room for one
    assert {fresh(i).status for i in ids} == {Status.COMPLETED}


def test_bad_queue_settings_are_reported(settings):
    from django_durable.checks import check_settings

    settings.DURABLE = {"QUEUES": {"emails": {"concurrency": 0}, "": {}, "x": {"speed": 1}}}
    errors = check_settings()
    assert [e.id for e in errors] == ["django_durable.E020"] * 3
    settings.DURABLE = {"QUEUES": ["emails"]}
    assert [e.id for e in check_settings()] == ["django_durable.E020"]
