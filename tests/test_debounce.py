"""debounce=Debounce(period, timeout): a burst of keyed starts becomes one run."""

import time
from datetime import timedelta

import pytest

import django_durable as durable
from django_durable import activity, store
from django_durable.models import Run, Status
from django_durable.testing import drain
from tests.helpers import fresh, pick_up
from tests.testapp.workflows import IndexArticle

pytestmark = pytest.mark.django_db


def test_a_burst_of_five_becomes_one_run_with_the_last_input():
    first = durable.start_detailed(IndexArticle, {"save": 1}, key="article:42")
    assert first.outcome == "started"
    for n in range(2, 6):
        assert durable.start_detailed(IndexArticle, {"save": n}, key="article:42") == (
            first.run_id,
            "debounced",
        )
    assert Run.objects.count() == 1
    assert drain() == 0  # still within the period
    run = fresh(first.run_id)
    assert run.input == {"save": 5}
    assert [a.details["outcome"] for a in activity.list(kinds=["key_duplicate"])] == [
        "debounced"
    ] * 4
    time.sleep(1.1)
    assert drain() == 1
    run = fresh(first.run_id)
    assert run.status == Status.COMPLETED
    assert run.result == {"save": 5}


def test_each_start_restarts_the_wait():
    run_id = durable.start(IndexArticle, {"save": 1}, key="k")
    due_first = fresh(run_id).due_at
    time.sleep(0.3)
    durable.start(IndexArticle, {"save": 2}, key="k")
    due_second = fresh(run_id).due_at
    assert due_second - due_first >= timedelta(seconds=0.3)


def test_a_steady_stream_is_capped_by_the_timeout():
    """Starts every 0.25 s for 3 s: the period (1 s) never passes, the timeout (2 s) does."""
    run_id = durable.start(IndexArticle, {"save": 0}, key="stream")
    created = fresh(run_id).created_at
    began = time.monotonic()
    answers = []
    n = 0
    while time.monotonic() - began < 3.0 and fresh(run_id).status == Status.PENDING:
        n += 1
        answers.append(durable.start_detailed(IndexArticle, {"save": n}, key="stream"))
        drain()
        time.sleep(0.25)
    run = fresh(run_id)
    assert run.status == Status.COMPLETED
    assert timedelta(seconds=2) <= run.started_at - created < timedelta(seconds=2.5)
    assert run.result == {"save": n}  # it ran with the last input it was given
    assert answers == [(run_id, "debounced")] * n


def test_once_a_worker_picked_the_run_up_the_next_start_is_an_ordinary_duplicate():
    run_id = durable.start(IndexArticle, {"save": 1}, key="picked")
    Run.objects.filter(id=run_id).update(due_at=store.now())
    pick_up(run_id)
    assert durable.start_detailed(IndexArticle, {"save": 2}, key="picked") == (
        run_id,
        "use_existing",
    )
    assert fresh(run_id).input == {"save": 1}


def test_the_workflow_timeout_counts_from_when_the_run_is_due():
    run_id = durable.start(IndexArticle, {}, key="t")
    run = fresh(run_id)
    assert run.timeout_at == run.due_at + timedelta(minutes=5)


def test_starts_without_a_key_are_not_debounced():
    run_id = durable.start(IndexArticle, {"save": 1})
    assert drain() == 1
    assert fresh(run_id).status == Status.COMPLETED
