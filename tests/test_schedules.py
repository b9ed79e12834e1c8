"""Cron schedules: definition, keyed fires, trigger_schedule, enable/disable."""

from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError

import django_durable as durable
from django_durable import activity, store
from django_durable.models import Run, Schedule
from django_durable.operations import schedules as scheduler
from django_durable.testing import drain
from tests.testapp.workflows_engine import Cleanup, StrictCleanup, Tick

pytestmark = pytest.mark.django_db


def make_due(name):
    Schedule.objects.filter(name=name).update(next_fire_at=store.now() - timedelta(seconds=1))


def test_schedule_creates_a_row_idempotently_by_name():
    first = durable.schedule(Cleanup, "*/5 * * * *", key="cleanup", name="cleanup-5")
    assert first.workflow == "cleanup" and first.key == "cleanup" and first.enabled
    assert first.next_fire_at > store.now()
    assert first.next_fire_at.minute % 5 == 0 and first.next_fire_at.second == 0
    again = durable.schedule(Cleanup, "*/5 * * * *", key="cleanup", name="cleanup-5")
    assert again.id == first.id and again.next_fire_at == first.next_fire_at
    changed = durable.schedule(Cleanup, "0 * * * *", key="cleanup", name="cleanup-5")
    assert changed.id == first.id and changed.cron == "0 * * * *"
    assert Schedule.objects.filter(name="cleanup-5").count() == 1


def test_schedule_default_name_and_timezone():
    sched = durable.schedule("tick", "0 9 * * *", timezone="Europe/Paris")
    assert sched.name == "tick@0 9 * * *"
    # 09:00 in Paris is 07:00 or 08:00 UTC depending on the season.
    assert sched.next_fire_at.astimezone(UTC).hour in (7, 8)
    keyed = durable.schedule("tick", "0 9 * * *", key="k")
    assert keyed.name == "tick:k@0 9 * * *"


def test_schedule_rejects_bad_arguments_before_writing():
    with pytest.raises(ValueError, match="cron"):
        durable.schedule(Tick, "every minute")
    with pytest.raises(ValueError, match="timezone"):
        durable.schedule(Tick, "* * * * *", timezone="Mars/Olympus")
    with pytest.raises(ValidationError):
        durable.schedule(Tick, "* * * * *", key="")
    with pytest.raises(TypeError):
        durable.schedule(Tick, "* * * * *", input=[1])
    with pytest.raises(LookupError):
        durable.schedule("nope", "* * * * *")
    assert not Schedule.objects.filter(workflow="tick").exists()


def test_declared_schedules_are_synced():
    scheduler.sync_declared()
    sched = Schedule.objects.get(name="cleanup-nightly")
    assert sched.declared and sched.key == "nightly" and sched.cron == "0 3 * * *"
    # A declared row whose declaration is gone is deleted; rows from schedule() stay.
    Schedule.objects.create(name="gone", workflow="tick", cron="* * * * *", declared=True)
    durable.schedule(Tick, "* * * * *", name="by-hand")
    scheduler.sync_declared()
    assert not Schedule.objects.filter(name="gone").exists()
    assert Schedule.objects.filter(name="by-hand").exists()


def test_fire_due_starts_due_schedules_once_and_moves_on():
    durable.schedule(Tick, "*/5 * * * *", name="tick-5")
    assert scheduler.fire_due() == 0
    make_due("tick-5")
    assert scheduler.fire_due() == 1
    assert scheduler.fire_due() == 0  # the tick has moved on
    [run] = Run.objects.filter(workflow="tick")
    sched = Schedule.objects.get(name="tick-5")
    assert sched.last_run_id == run.id and sched.next_fire_at > store.now()
    assert run.context["durable.schedule"]["name"] == "tick-5"
    assert run.key is None


def test_missed_ticks_fire_once():
    durable.schedule(Tick, "* * * * *", name="every-minute")
    Schedule.objects.filter(name="every-minute").update(
        next_fire_at=store.now() - timedelta(hours=3)
    )
    assert scheduler.fire_due() == 1
    assert Run.objects.filter(workflow="tick").count() == 1


def test_keyed_fire_while_the_last_run_holds_the_key_use_existing():
    durable.schedule(Cleanup, "*/5 * * * *", key="cleanup", name="c")
    make_due("c")
    scheduler.fire_due()
    drain()
    [first] = Run.objects.filter(workflow="cleanup")
    assert first.status == "waiting" and first.holds_key  # still going at the next fire
    make_due("c")
    assert scheduler.fire_due() == 1
    assert Run.objects.filter(workflow="cleanup").count() == 1
    [dupe] = activity.list(kinds=["key_duplicate"], run_id=first.id)
    assert dupe.details["outcome"] == "use_existing"
    sched = Schedule.objects.get(name="c")
    assert sched.failures == 0 and sched.last_run_id == first.id
    # trigger_schedule follows the same rule: nothing started, None returned.
    assert durable.trigger_schedule("c") is None
    assert Run.objects.filter(workflow="cleanup").count() == 1


def test_keyed_fire_while_the_last_run_holds_the_key_error_is_skipped():
    durable.schedule(StrictCleanup, "*/5 * * * *", key="strict", name="s")
    first = durable.trigger_schedule("s")
    assert first is not None
    drain()
    make_due("s")
    assert scheduler.fire_due() == 1  # fired (and skipped), never raised
    assert durable.trigger_schedule("s") is None
    assert Run.objects.filter(workflow="strict_cleanup").count() == 1
    dupes = activity.list(kinds=["key_duplicate"], run_id=first)
    assert [d.details["outcome"] for d in dupes] == ["error", "error"]
    assert Schedule.objects.get(name="s").failures == 0


def test_keyed_fire_after_the_holder_finished_starts_a_new_run():
    durable.schedule(Tick, "*/5 * * * *", key="t", name="t")
    first = durable.trigger_schedule("t")
    drain()
    assert durable.get_run(first).status == "completed"
    second = durable.trigger_schedule("t")
    assert second not in (None, first)
    assert durable.get_run(second).holds_key


def test_disabled_schedules_do_not_fire_and_enable_moves_to_the_next_tick():
    durable.schedule(Tick, "* * * * *", name="off")
    make_due("off")
    durable.disable_schedule("off")
    assert scheduler.fire_due() == 0
    durable.enable_schedule("off")
    assert Schedule.objects.get(name="off").next_fire_at > store.now()
    assert scheduler.fire_due() == 0
    # trigger_schedule fires a disabled schedule too.
    durable.disable_schedule("off")
    assert durable.trigger_schedule("off") is not None
    with pytest.raises(Schedule.DoesNotExist):
        durable.disable_schedule("no-such")
    with pytest.raises(Schedule.DoesNotExist):
        durable.trigger_schedule("no-such")


def test_a_fire_that_cannot_start_counts_as_a_failure():
    Schedule.objects.create(
        name="broken",
        workflow="vanished",
        cron="* * * * *",
        next_fire_at=store.now() - timedelta(seconds=1),
    )
    assert scheduler.fire_due() == 1
    assert Schedule.objects.get(name="broken").failures == 1


def test_a_tick_already_fired_elsewhere_is_not_fired_again():
    durable.schedule(Tick, "* * * * *", name="cas")
    make_due("cas")
    stale = Schedule.objects.get(name="cas")
    assert scheduler.fire_due() == 1
    # A node that read the row before the first fire committed finds it moved on.
    assert scheduler._fire_tick(stale, store.now()) == 0
    assert Run.objects.filter(workflow="tick").count() == 1


def test_next_fire_follows_the_timezone():
    from django_durable.workflows.cron import next_fire

    after = datetime(2026, 3, 28, 12, 0, tzinfo=UTC)  # the day before DST in Paris
    assert next_fire("0 9 * * *", "Europe/Paris", after) == datetime(2026, 3, 29, 7, 0, tzinfo=UTC)


def test_bad_cron_on_a_class_fails_at_import():
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="cron"):

        class BadCron(durable.Workflow):
            schedules = [durable.Cron("sometimes")]

            @durable.step
            def one(self, ctx):
                pass


def statements_of(call):
    """The SQL statements ``call()`` runs, savepoints left out (inside the test's
    transaction every ``atomic()`` adds them)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        call()
    return [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"].upper()]


def test_fire_due_query_counts():
    scheduler.fire_due()  # the first call of a process syncs declared schedules
    # Nothing due: one indexed SELECT.
    assert len(statements_of(scheduler.fire_due)) == 1
    durable.schedule(Tick, "*/5 * * * *", name="counted")
    make_due("counted")
    # One due schedule: the locking SELECT, the run's insert (on PostgreSQL a call of
    # durable_start, which also sends the NOTIFY that wakes a worker for the new
    # run), the compare-and-set.
    statements = statements_of(scheduler.fire_due)
    inserts = [sql for sql in statements if "durable_start_v2(" in sql]
    assert len(inserts) == (1 if store.engine().LISTENS else 0)
    assert len(statements) == 3, statements
