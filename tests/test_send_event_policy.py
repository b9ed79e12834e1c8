"""on_duplicate=("send_event", name): later starts hand their input to the holder."""

import pytest

import django_durable as durable
from django_durable import activity
from django_durable.models import Event, Run, Status
from django_durable.testing import drain
from tests.helpers import fresh
from tests.testapp.workflows import CatchUpArticle

pytestmark = pytest.mark.django_db


def test_a_later_start_reaches_the_waiting_holder_as_an_event():
    holder = durable.start(CatchUpArticle, {"id": 42, "rev": 8}, key="article:42")
    drain()
    assert fresh(holder).waiting_for == "event:article_updated"
    result = durable.start_detailed(CatchUpArticle, {"id": 42, "rev": 9}, key="article:42")
    assert result == (holder, "send_event")
    assert Run.objects.count() == 1  # nothing new was created
    drain()
    run = fresh(holder)
    assert run.status == Status.COMPLETED
    assert run.input == {"id": 42, "rev": 8}  # the first start's input is the run's input
    assert run.result == {"first_rev": 8, "update": {"id": 42, "rev": 9}}
    dup = activity.list(kinds=["key_duplicate"])[0]
    assert (dup.details["outcome"], dup.details["input_changed"]) == ("send_event", True)


def test_an_update_before_the_holder_waits_is_kept_and_the_newest_wins():
    holder = durable.start(CatchUpArticle, {"id": 1, "rev": 1}, key="article:1")
    for rev in (2, 3, 4):
        assert durable.start(CatchUpArticle, {"id": 1, "rev": rev}, key="article:1") == holder
    assert Event.objects.filter(run_id=holder, delivered_at__isnull=True).count() == 3
    drain()
    assert fresh(holder).result == {"first_rev": 1, "update": {"id": 1, "rev": 4}}


def test_a_finished_holder_that_reuse_keeps_raises_key_taken():
    holder = durable.start(CatchUpArticle, {"id": 5, "rev": 1}, key="article:5")
    durable.send_event(holder, "article_updated", None, buffer=True)
    drain()
    assert fresh(holder).status == Status.COMPLETED
    with pytest.raises(durable.KeyTaken) as taken:
        durable.start(CatchUpArticle, {"id": 5, "rev": 2}, key="article:5")
    assert taken.value.holder_id == holder
