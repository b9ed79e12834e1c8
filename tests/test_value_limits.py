"""What a caller passes in is bounded as a step's result is (issue 43, items 3 and 10).

A run's input, an event's payload, an input's value and a task's arguments are
refused over ``DURABLE["MAX_VALUE_BYTES"]`` of JSON (``ValueError``) and when a dict
key anywhere in them is not a str (``TypeError``: JSON would store ``{1: "a"}`` as
``{"1": "a"}``), at every way in, before anything is written, leaving the caller's
transaction usable. (The start entry points, ``ctx.start`` included, are in
test_bad_input.py's table.)
"""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.urls import reverse

import django_durable as durable
from django_durable import conf as durable_conf
from django_durable.dashboard import values
from django_durable.models import Activity, Event, Run, Schedule, Status
from django_durable.testing import drain
from tests.testapp import framework_tasks
from tests.testapp.workflows import SyncAccount, WaitsForApproval, WaitsForEvent

pytestmark = pytest.mark.django_db

LIMIT = 1000


@pytest.fixture
def small_limit(settings):
    settings.DURABLE = {"MAX_VALUE_BYTES": LIMIT}


def sized(size: int) -> dict:
    """An input (or payload) whose JSON text is exactly ``size`` bytes."""
    value = {"blob": ""}
    value["blob"] = "x" * (size - len(json.dumps(value)))
    assert len(json.dumps(value)) == size
    return value


def waiting(workflow) -> Run:
    run_id = durable.start(workflow, {})
    drain()
    run = Run.objects.get(id=run_id)
    assert run.status == Status.WAITING
    return run


def assert_refused_and_nothing_written(call, raises, words, counts):
    """``call`` raises inside the caller's transaction, writes nothing (``counts``
    before and after), and the transaction goes on: a start in it works."""
    before = counts()
    with transaction.atomic():
        with pytest.raises(raises, match=words):
            call()
        assert counts() == before
        durable.start(SyncAccount, {"n": 1})
        transaction.set_rollback(True)
    assert counts() == before


def counts():
    return (Run.objects.count(), Event.objects.count(), Activity.objects.count())


def test_an_input_of_exactly_the_limit_is_started_one_byte_more_is_refused(small_limit):
    run_id = durable.start(SyncAccount, sized(LIMIT))
    assert len(json.dumps(durable.get_run(run_id).input)) == LIMIT
    assert_refused_and_nothing_written(
        lambda: durable.start(SyncAccount, sized(LIMIT + 1)),
        ValueError,
        rf"input is {LIMIT + 1} bytes of JSON, over the limit of {LIMIT}",
        counts,
    )


def test_a_str_subclass_key_is_a_str():
    class Name(str):
        pass

    run_id = durable.start(SyncAccount, {Name("a"): 1})
    assert durable.get_run(run_id).input == {"a": 1}


SENDS = {
    "send_event": (WaitsForEvent, lambda run, value: durable.send_event(run.id, "go", value)),
    "asend_event": (
        WaitsForEvent,
        lambda run, value: async_to_sync(durable.asend_event)(run.id, "go", value),
    ),
    "send_event-buffered": (
        SyncAccount,
        lambda run, value: durable.send_event(run.id, "later", value, buffer=True),
    ),
    "provide_input": (
        WaitsForApproval,
        lambda run, value: durable.provide_input(run.id, "approval", value),
    ),
    "aprovide_input": (
        WaitsForApproval,
        lambda run, value: async_to_sync(durable.aprovide_input)(run.id, "approval", value),
    ),
}

BAD_VALUES = [
    pytest.param(sized(LIMIT + 1), ValueError, "MAX_VALUE_BYTES", id="too-big"),
    pytest.param(
        {1: "a"}, TypeError, "payload has a key that is not a str: 1 \\(int\\)", id="int-key"
    ),
    pytest.param(
        {"by": [{None: 1}]},
        TypeError,
        r"payload\['by'\]\[0\] has a key that is not a str: None",
        id="nested-none-key",
    ),
]


@pytest.mark.parametrize("send", SENDS)
@pytest.mark.parametrize(("value", "raises", "words"), BAD_VALUES)
def test_a_payload_or_an_input_value_is_refused_before_anything_is_written(
    small_limit, send, value, raises, words
):
    workflow, call = SENDS[send]
    run = (
        waiting(workflow)
        if workflow is not SyncAccount
        else durable.get_run(durable.start(SyncAccount, {}))
    )
    status = run.status
    assert_refused_and_nothing_written(lambda: call(run, value), raises, words, counts)
    run.refresh_from_db()
    assert run.status == status
    # The limit is the same for every way in: a payload of exactly the limit goes in.
    call(run, sized(LIMIT))
    assert Event.objects.filter(run=run).count() == 1


@pytest.mark.parametrize(("value", "raises", "words"), BAD_VALUES)
def test_a_rerun_with_a_new_input_is_refused_before_anything_is_written(
    small_limit, value, raises, words
):
    original = durable.start(SyncAccount, {"n": 1})
    drain()
    words = words.replace("payload", "input")
    assert_refused_and_nothing_written(
        lambda: durable.rerun(original, input=value), raises, words, counts
    )
    assert_refused_and_nothing_written(
        lambda: async_to_sync(durable.arerun)(original, input=value), raises, words, counts
    )


def test_a_schedule_refuses_such_an_input(small_limit):
    before = Schedule.objects.count()
    for value, raises in ((sized(LIMIT + 1), ValueError), ({2: "b"}, TypeError)):
        with pytest.raises(raises):
            durable.schedule(SyncAccount, "0 * * * *", input=value)
    assert Schedule.objects.count() == before


@pytest.mark.parametrize(
    ("args", "raises", "words"),
    [
        pytest.param(("x" * LIMIT,), ValueError, "MAX_VALUE_BYTES", id="too-big"),
        pytest.param(({1: "a"},), TypeError, "key that is not a str: 1", id="int-key"),
    ],
)
def test_a_task_enqueue_is_refused_before_anything_is_written(small_limit, args, raises, words):
    assert_refused_and_nothing_written(
        lambda: framework_tasks.echo.enqueue(*args), raises, words, counts
    )
    assert_refused_and_nothing_written(
        lambda: async_to_sync(framework_tasks.echo.aenqueue)(*args), raises, words, counts
    )


# --- no admin page renders a value whole ------------------------------------------


def change_page(client, run_id) -> str:
    response = client.get(reverse("admin:django_durable_run_change", args=[run_id]))
    assert response.status_code == 200
    return response.content.decode()


def test_the_admin_change_page_of_a_run_shows_its_big_values_cut(admin_client):
    """An input as big as allowed, and a result, context and state as big as an older
    row (or a folded input list) may hold: the page stays small and says what it cut."""
    limit = durable_conf.get("MAX_VALUE_BYTES")
    run_id = durable.start(SyncAccount, sized(limit))
    huge = {"blob": "z" * (8 * 1024 * 1024)}
    Run.objects.filter(id=run_id).update(
        result=huge, context=huge, state=huge, inputs=[huge], error={"message": "m" * 10**6}
    )
    html = change_page(admin_client, run_id)
    assert len(html) < 8 * values.SHOWN + 100_000, len(html)
    assert "z" * (values.SHOWN + 1) not in html
    assert f"Shown: the first {values.SHOWN:,} of {limit:,} characters of JSON." in html
    assert html.count(f"of {len(json.dumps(huge)):,} characters of JSON.") == 3
    assert f"of {len(json.dumps([huge])):,} characters of JSON." in html  # the inputs
    assert reverse("django_durable:run", args=[run_id]) in html


def test_the_admin_change_page_shows_small_values_whole_and_links_related_runs(admin_client):
    parent = durable.start(SyncAccount, {"n": 1})
    run_id = durable.start(SyncAccount, {"n": 2, "who": "<b>ada</b>"})
    Run.objects.filter(id=run_id).update(parent_id=parent)
    html = change_page(admin_client, run_id)
    assert "&quot;who&quot;: &quot;&lt;b&gt;ada&lt;/b&gt;&quot;" in html  # escaped, whole
    assert "Shown: the first" not in html
    assert f'{reverse("django_durable:run", args=[parent])}">{parent}</a>' in html
    # An id that is no run is the admin's own answer, not an error.
    missing = admin_client.get(reverse("admin:django_durable_run_change", args=["nope"]))
    assert missing.status_code == 302
