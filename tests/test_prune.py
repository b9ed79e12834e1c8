"""Pruning deletes finished runs past retention, which frees their keys, and old
activity; it never touches a run that is still going."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

import django_durable as durable
from django_durable.models import (
    Activity,
    Run,
    Status,
    StepAttempt,
)
from django_durable.testing import drain
from tests.factories import ActivityFactory, RunFactory
from tests.helpers import manage_py

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)


def finished_days_ago(run_id, days: float):
    Run.objects.filter(id=run_id).update(finished_at=timezone.now() - days * DAY)


def test_prune_deletes_old_finished_runs_and_frees_their_keys():
    invoice = durable.start("send_invoice", {}, key="invoice:1")
    drain()
    finished_days_ago(invoice, 40)
    assert durable.prune() == 1  # the default retention is 30 days
    assert not Run.objects.filter(id=invoice).exists()
    assert not StepAttempt.objects.filter(run_id=invoice).exists()
    # Under reuse="never", retention is how long "never" lasts.
    result = durable.start_detailed("send_invoice", {}, key="invoice:1")
    assert result.outcome == "started" and result.run_id != invoice


def test_prune_keeps_runs_inside_retention():
    recent = durable.start("send_invoice", {}, key="invoice:1")
    drain()
    finished_days_ago(recent, 10)
    assert durable.prune() == 0
    assert durable.prune(older_than=11 * DAY) == 0
    assert durable.prune(older_than=9 * DAY) == 1


@pytest.mark.parametrize(
    "status", [Status.PENDING, Status.RUNNING, Status.WAITING, Status.COMPENSATING]
)
def test_prune_never_touches_a_run_that_is_still_going(status):
    old = timezone.now() - 400 * DAY
    run = RunFactory(key="account:7", status=status, created_at=old, finished_at=old)
    assert durable.prune(older_than=timedelta(0)) == 0
    assert Run.objects.get(id=run.id).holds_key


@pytest.mark.parametrize(
    "status",
    [
        Status.COMPLETED,
        Status.FAILED,
        Status.CANCELLED,
        Status.COMPENSATED,
        Status.COMPENSATION_FAILED,
    ],
)
def test_prune_deletes_every_finished_status(status):
    RunFactory(key="account:7", status=status, finished_at=timezone.now() - 40 * DAY)
    assert durable.prune() == 1


def test_retention_none_keeps_runs_forever(settings):
    settings.DURABLE = {"RUN_RETENTION": None}
    RunFactory(status=Status.COMPLETED, finished_at=timezone.now() - 4000 * DAY)
    assert durable.prune() == 0
    assert Run.objects.count() == 1


def test_prune_deletes_old_activity(settings):
    settings.DURABLE = {"ACTIVITY_RETENTION": 2 * DAY}
    ActivityFactory(created_at=timezone.now() - 3 * DAY)
    kept = ActivityFactory(created_at=timezone.now() - 1 * DAY)
    durable.prune()
    assert list(Activity.objects.all()) == [kept]


def test_prune_works_in_batches(settings):
    settings.DURABLE = {"PRUNE_BATCH_SIZE": 2}
    RunFactory.create_batch(5, status=Status.COMPLETED, finished_at=timezone.now() - 40 * DAY)
    assert durable.prune() == 5
    assert not Run.objects.exists()


def test_a_pruned_holder_leaves_the_run_behind_it_in_place():
    """A run_again run waiting behind a pruned holder loses only the link."""
    holder = RunFactory(
        key="account:7", status=Status.COMPLETED, finished_at=timezone.now() - 40 * DAY
    )
    waiting = RunFactory(key="account:7", holds_key=False, runs_after=holder, due_at=None)
    assert durable.prune() == 1
    waiting.refresh_from_db()
    assert (waiting.status, waiting.runs_after_id) == (Status.PENDING, None)


def call_prune(*args) -> str:
    out = StringIO()
    call_command("durable_prune", *args, stdout=out)
    return out.getvalue()


def test_the_command_prunes_and_says_how_many():
    old = RunFactory(
        key="invoice:1",
        workflow="send_invoice",
        status=Status.COMPLETED,
        finished_at=timezone.now() - 40 * DAY,
    )
    RunFactory(
        key="invoice:2",
        workflow="send_invoice",
        status=Status.COMPLETED,
        finished_at=timezone.now() - 1 * DAY,
    )
    assert call_prune() == "pruned 1 finished runs\n"
    assert not Run.objects.filter(id=old.id).exists()
    assert durable.start_detailed("send_invoice", {}, key="invoice:1").outcome == "started"


def test_the_command_dry_run_counts_and_deletes_nothing():
    RunFactory.create_batch(3, status=Status.COMPLETED, finished_at=timezone.now() - 40 * DAY)
    ActivityFactory(created_at=timezone.now() - 30 * DAY)
    assert call_prune("--dry-run") == "3 finished runs would be pruned\n"
    assert Run.objects.count() == 3
    assert Activity.objects.count() == 1


@pytest.mark.parametrize(
    "older_than, pruned", [("2d", 1), ("12h", 2), ("90s", 2), ("7200", 2), ("5d", 0)]
)
def test_the_command_takes_older_than(older_than, pruned):
    RunFactory(status=Status.COMPLETED, finished_at=timezone.now() - 3 * DAY)
    RunFactory(status=Status.COMPLETED, finished_at=timezone.now() - timedelta(hours=13))
    assert call_prune("--older-than", older_than) == f"pruned {pruned} finished runs\n"
    assert (
        call_prune("--older-than", older_than, "--dry-run") == "0 finished runs would be pruned\n"
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("soon", "not a duration"),
        ("7x", "not a duration"),
        ("inf", "not a duration"),
        ("nan", "not a duration"),
        ("1e300d", "not a duration"),
        ("-1d", "never negative"),
        ("-5", "never negative"),
    ],
)
def test_the_command_refuses_a_bad_duration_and_deletes_nothing(text, message):
    RunFactory(status=Status.COMPLETED, finished_at=timezone.now() - timedelta(seconds=5))
    with pytest.raises(CommandError, match=message):
        call_prune(f"--older-than={text}")
    assert Run.objects.count() == 1


def test_the_command_refuses_an_age_before_year_1_with_exit_2():
    RunFactory(status=Status.COMPLETED, finished_at=timezone.now() - 40 * DAY)
    with pytest.raises(CommandError, match="before year 1") as refused:
        call_prune("--older-than", "999999999d")
    assert refused.value.returncode == 2
    assert Run.objects.count() == 1


def test_older_than_zero_prunes_every_finished_run():
    RunFactory(status=Status.COMPLETED, finished_at=timezone.now() - timedelta(seconds=1))
    RunFactory(status=Status.PENDING)
    assert call_prune("--older-than", "0") == "pruned 1 finished runs\n"
    assert list(Run.objects.values_list("status", flat=True)) == [Status.PENDING]


@pytest.mark.parametrize(
    "older_than, error, message",
    [
        (timedelta(days=-1), ValueError, "older_than must not be negative"),
        (timedelta(microseconds=-1), ValueError, "older_than must not be negative"),
        (timedelta.max, ValueError, "older_than reaches back before year 1"),
        (5, TypeError, "older_than must be a timedelta"),
        ("7d", TypeError, "older_than must be a timedelta"),
    ],
)
def test_prune_refuses_a_bad_older_than_before_deleting_anything(older_than, error, message):
    RunFactory(status=Status.COMPLETED, finished_at=timezone.now() - timedelta(seconds=5))
    ActivityFactory(created_at=timezone.now() - 30 * DAY)
    for dry_run in (True, False):
        with pytest.raises(error, match=message):
            durable.prune(older_than=older_than, dry_run=dry_run)
    assert (Run.objects.count(), Activity.objects.count()) == (1, 1)


def manage_prune(*args):
    return manage_py("durable_prune", *args)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_real_command_line_answers_a_bad_duration_in_one_line_with_exit_2():
    RunFactory(status=Status.COMPLETED, finished_at=timezone.now() - timedelta(seconds=5))
    for text in ("7x", "inf", "-1d", "999999999d"):
        refused = manage_prune(f"--older-than={text}")
        assert refused.returncode == 2, (text, refused.stderr)
        assert "Traceback" not in refused.stderr
        # The parser's usage line and its error, or the command's error: one line each.
        errors = [line for line in refused.stderr.splitlines() if "rror" in line]
        assert len(errors) == 1, refused.stderr
    assert Run.objects.count() == 1


def test_prune_never_deletes_an_active_child_with_its_finished_parent():
    """Deleting a run deletes its children: a parent with a child still going waits."""
    old = timezone.now() - 40 * DAY
    parent = RunFactory(status=Status.COMPLETED, finished_at=old)
    child = RunFactory(status=Status.RUNNING, parent=parent, created_at=old)
    assert durable.prune() == 0
    assert Run.objects.filter(id__in=[parent.id, child.id]).count() == 2

    Run.objects.filter(id=child.id).update(status=Status.COMPLETED, finished_at=old)
    assert durable.prune() == 2
    assert not Run.objects.exists()


def test_prune_counts_children_deleted_with_their_parent(settings):
    """A batch that deletes a parent also deletes its children (cascade): they count."""
    settings.DURABLE = {"PRUNE_BATCH_SIZE": 1}
    old = timezone.now() - 40 * DAY
    parent = RunFactory(status=Status.COMPLETED, finished_at=old, created_at=old)
    RunFactory.create_batch(
        3, status=Status.COMPLETED, parent=parent, finished_at=old, created_at=old
    )
    assert durable.prune() == 4
    assert not Run.objects.exists()
