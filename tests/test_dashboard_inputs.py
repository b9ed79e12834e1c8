"""The dashboard's inputs page by kind, through Django's test client: the prompt, the
form each kind gets (approve / reject, radio buttons, checkboxes, a text box, a JSON
box), answers that resume the run, refused values shown as an error with nothing
written, and runs waiting for any or all of several events."""

import html as html_lib
import re

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

import django_durable as durable
from django_durable import step
from django_durable.models import Event, Status
from django_durable.testing import drain
from tests.helpers import fresh

pytestmark = pytest.mark.django_db


def asks(self, ctx):
    return ctx.wait_for_input("answer", **ctx.input)


@pytest.fixture
def asking(define):
    return define("dash_asks", asks=step(asks))


def waiting(workflow, **options):
    run_id = durable.start(workflow, options)
    drain()
    assert fresh(run_id).status == Status.WAITING
    return run_id


def card(client, run_id) -> str:
    """The run's card on the inputs page (up to the next card)."""
    response = client.get(reverse("django_durable:inputs"))
    assert response.status_code == 200
    page = response.content.decode()
    start = page.index(f'id="pending-{run_id}"')
    end = page.find('<div class="durable-pending"', start)
    return page[start : end if end > 0 else None]


def answer(client, run_id, **fields):
    fields.setdefault("name", "answer")
    fields.setdefault("wait", "input")
    url = reverse("django_durable:answer", args=[run_id])
    response = client.post(url, fields, follow=True)
    assert response.status_code == 200
    return response.content.decode()


def error_message(page: str) -> str:
    found = re.search(r'<li class="error">(.*?)</li>', page, re.S)
    return html_lib.unescape(found.group(1)) if found else ""


def test_approval_gets_approve_and_reject_buttons(admin_client, admin_user, asking):
    run_id = waiting(asking, kind="approval", prompt="Ship <order> 7?")
    shown = card(admin_client, run_id)
    assert "Ship &lt;order&gt; 7?" in shown  # the prompt, escaped
    assert 'name="approval" value="approve"' in shown
    assert 'name="approval" value="reject"' in shown
    assert 'name="kind" value="approval"' in shown
    answer(admin_client, run_id, kind="approval", approval="reject")
    drain()
    assert (fresh(run_id).status, fresh(run_id).result) == (Status.COMPLETED, False)
    assert LogEntry.objects.filter(user=admin_user, object_id=str(run_id)).exists()


def test_single_choice_gets_radio_buttons_that_keep_each_choice_type(admin_client, asking):
    run_id = waiting(asking, kind="single_choice", choices=["1", 1, "blue"], prompt="Pick")
    shown = card(admin_client, run_id)
    assert shown.count('type="radio"') == 3
    assert 'value="&quot;1&quot;"' in shown and 'value="1"' in shown
    answer(admin_client, run_id, kind="single_choice", choice="1")  # the number 1
    drain()
    assert fresh(run_id).result == 1


def test_multi_choice_gets_checkboxes(admin_client, asking):
    run_id = waiting(asking, kind="multi_choice", choices=["red", "green", "blue"])
    shown = card(admin_client, run_id)
    assert shown.count('type="checkbox"') == 3
    answer(admin_client, run_id, kind="multi_choice", choice=['"red"', '"blue"'])
    drain()
    assert fresh(run_id).result == ["red", "blue"]


def test_free_text_gets_a_text_box(admin_client, asking):
    run_id = waiting(asking, kind="free_text", prompt="Why?")
    shown = card(admin_client, run_id)
    assert '<textarea name="text"' in shown and "Why?" in shown
    answer(admin_client, run_id, kind="free_text", text='{"not": "parsed"}')
    drain()
    assert fresh(run_id).result == '{"not": "parsed"}'


@pytest.mark.parametrize("kind", ["form", "any"])
def test_form_and_any_get_a_json_box(admin_client, asking, kind):
    run_id = waiting(asking, kind=kind)
    shown = card(admin_client, run_id)
    assert '<textarea name="json"' in shown
    answer(admin_client, run_id, kind=kind, json='{"name": "Ada"}')
    drain()
    assert fresh(run_id).result == {"name": "Ada"}


@pytest.mark.parametrize(
    ("options", "fields", "says"),
    [
        ({"kind": "form"}, {"kind": "form", "json": "[1, 2]"}, "a form input takes a dict"),
        (
            {"kind": "single_choice", "choices": ["a", "b"]},
            {"kind": "single_choice", "choice": '"c"'},
            '"c" is not one of the choices',
        ),
        (
            {"kind": "approval"},
            {"kind": "any", "json": '"yes"'},  # a form posted for another kind
            "an approval input takes true or false",
        ),
    ],
)
def test_a_refused_value_shows_the_error_and_writes_nothing(
    admin_client, asking, options, fields, says
):
    run_id = waiting(asking, **options)
    before = fresh(run_id)
    page = answer(admin_client, run_id, **fields)
    assert says in error_message(page)
    assert f"Run {run_id} was not answered" in error_message(page)
    after = fresh(run_id)
    assert (after.status, after.state) == (Status.WAITING, before.state)
    assert not Event.objects.filter(run_id=run_id).exists()
    assert not LogEntry.objects.exists()
    assert f'id="pending-{run_id}"' in page  # still listed, to answer again


def test_runs_waiting_for_any_or_all_events_are_answered_one_event_at_a_time(admin_client, define):
    def both(self, ctx):
        return ctx.wait_for_all(["paid", "packed"])

    def either(self, ctx):
        return list(ctx.wait_for_any(["approved", "rejected"]))

    every = waiting(define("dash_all", both=step(both)))
    one = waiting(define("dash_any", either=step(either)))
    shown = card(admin_client, every)
    assert "waits for all of the events" in shown and '<select name="name">' in shown
    assert "one of the events" in card(admin_client, one)
    answer(admin_client, every, wait="event", name="packed", kind="any", json='"box"')
    assert fresh(every).status == Status.WAITING
    shown = card(admin_client, every)
    assert '<select name="name">' not in shown and 'name="name" value="paid"' in shown
    answer(admin_client, every, wait="event", name="paid", kind="any", json="5")
    answer(admin_client, one, wait="event", name="rejected", kind="any", json="null")
    drain()
    assert fresh(every).result == {"paid": 5, "packed": "box"}
    assert fresh(one).result == ["rejected", None]
