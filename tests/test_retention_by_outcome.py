"""``Workflow.retention``: finished runs kept per workflow and outcome; the statuses
it does not name fall back to ``DURABLE["RUN_RETENTION"]``."""

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured

import django_durable as durable
from django_durable import checks, store
from django_durable.models import FINISHED_STATUSES, Run, Status
from django_durable.operations import retention
from django_durable.workflows.retention import FINISHED
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db

KEEP = {"completed": durable.days(7), "failed": durable.days(90), "cancelled": None}


def _finished(workflow, status, days, key=None):
    at = store.now() - timedelta(days=days)
    return RunFactory(
        workflow=workflow.name, status=status, key=key, created_at=at, finished_at=at
    ).id


def _left(ids):
    return set(Run.objects.filter(id__in=ids).values_list("id", flat=True))


@pytest.fixture
def kept(define):
    return define("kept_by_outcome", retention=KEEP)


def test_each_outcome_is_kept_for_its_own_time(kept, settings):
    settings.DURABLE = {"RUN_RETENTION": durable.days(30)}
    old_completed = _finished(kept, Status.COMPLETED, 8, key="c:1")
    new_completed = _finished(kept, Status.COMPLETED, 6)
    old_failed = _finished(kept, Status.FAILED, 91)
    new_failed = _finished(kept, Status.FAILED, 60)
    ancient_cancelled = _finished(kept, Status.CANCELLED, 1000)
    fallback_old = _finished(kept, Status.COMPENSATED, 31)  # not named: RUN_RETENTION
    fallback_new = _finished(kept, Status.COMPENSATED, 29)
    ids = [
        old_completed,
        new_completed,
        old_failed,
        new_failed,
        ancient_cancelled,
        fallback_old,
        fallback_new,
    ]
    assert durable.prune(dry_run=True) == 3
    assert durable.prune() == 3
    assert _left(ids) == {new_completed, new_failed, ancient_cancelled, fallback_new}
    # The pruned holder's key is free again.
    assert durable.start_detailed(kept, {}, key="c:1").outcome == "started"


def test_named_statuses_are_pruned_without_a_run_retention(kept, define, settings):
    settings.DURABLE = {"RUN_RETENTION": None}
    other = define("kept_forever")
    old_completed = _finished(kept, Status.COMPLETED, 8)
    fallback = _finished(kept, Status.COMPENSATED, 400)
    others = _finished(other, Status.COMPLETED, 400)
    assert durable.prune() == 1
    assert _left([old_completed, fallback, others]) == {fallback, others}


def test_none_keeps_until_prune_older_than(kept, settings):
    settings.DURABLE = {"RUN_RETENTION": durable.days(30)}
    cancelled = _finished(kept, Status.CANCELLED, 1000, key="x:1")
    assert durable.prune() == 0
    assert durable.prune(older_than=durable.days(500)) == 1
    assert not _left([cancelled])
    assert durable.start_detailed(kept, {}, key="x:1").outcome == "started"


def test_a_workflow_without_retention_keeps_the_global_rule(define, settings):
    settings.DURABLE = {"RUN_RETENTION": durable.days(30)}
    plain = define("kept_plainly")
    old, new = _finished(plain, Status.FAILED, 31), _finished(plain, Status.FAILED, 29)
    assert durable.prune() == 1
    assert _left([old, new]) == {new}


@pytest.mark.parametrize(
    "bad",
    [
        {"running": durable.days(1)},
        {"finished": durable.days(1)},
        {"failed": 7},
        {"failed": "7 days"},
        {"completed": -durable.days(1)},
        ["completed"],
    ],
)
def test_a_bad_retention_fails_the_definition(define, bad):
    with pytest.raises(ImproperlyConfigured, match="retention"):
        define(f"bad_retention_{abs(hash(repr(bad)))}", retention=bad)


def test_a_bad_retention_set_later_is_a_system_check_error(define):
    workflow = define("retention_set_later", retention={"failed": durable.days(1)})
    assert checks.check_workflow_retention() == []
    workflow.retention = {"failed": 3}
    (error,) = checks.check_workflow_retention()
    assert error.id == "django_durable.E030" and "retention_set_later" in error.msg


def test_the_finished_statuses_are_the_models():
    assert set(FINISHED) == set(FINISHED_STATUSES)


def test_kept_for_says_each_status(kept, settings):
    settings.DURABLE = {"RUN_RETENTION": durable.days(30)}
    said = {status: (keep, named) for status, keep, named in retention.kept_for(kept)}
    assert said["completed"] == (durable.days(7), True)
    assert said["cancelled"] == (None, True)
    assert said["compensated"] == (durable.days(30), False)
