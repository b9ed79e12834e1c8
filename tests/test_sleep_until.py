"""ctx.sleep_until: the run waits, without a worker, until an aware datetime."""

import datetime
from datetime import timedelta

import pytest
from django.utils import timezone

import django_durable as durable
from django_durable import step
from django_durable.models import Run, Status
from django_durable.testing import drain
from tests.helpers import fresh

pytestmark = pytest.mark.django_db


def test_sleep_until_suspends_until_the_time_then_resumes(define):
    def nap(self, ctx):
        ctx.sleep_until(datetime.datetime.fromisoformat(ctx.input["until"]))
        return "woke"

    workflow = define("sleeps_until", nap=step(nap))
    when = timezone.now() + timedelta(hours=2)
    run_id = durable.start(workflow, {"until": when.isoformat()})
    drain()
    run = fresh(run_id)
    assert (run.status, run.waiting_for, run.due_at) == (Status.WAITING, "sleep", when)
    assert drain() == 0
    # The controlled clock: the due time moved into the past in the database.
    Run.objects.filter(id=run_id).update(due_at=timezone.now() - timedelta(seconds=1))
    assert drain() == 1
    assert (fresh(run_id).status, fresh(run_id).result) == (Status.COMPLETED, "woke")


@pytest.mark.parametrize("when", [datetime.datetime(2030, 1, 1), "2030-01-01", 3600])
def test_sleep_until_refuses_what_is_not_an_aware_datetime(define, when):
    caught = []

    def nap(self, ctx):
        try:
            ctx.sleep_until(when)
        except TypeError as exc:
            caught.append(exc)
        return "went on"

    run_id = durable.start(define("sleeps_badly", nap=step(nap)))
    drain()
    assert fresh(run_id).status == Status.COMPLETED
    assert len(caught) == 1
