"""ctx.wait_for_input's kinds, prompt, choices and on_timeout; provide_input checking
the value against the kind before it writes anything; list_pending_inputs."""

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.utils import timezone

import django_durable as durable
from django_durable import step, store
from django_durable.models import Activity, Event, Run, Status
from django_durable.testing import drain
from tests.helpers import fresh
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db

COLOURS = ["red", "green", 1]

# kind, choices, a value that fits, values that don't.
KINDS = [
    ("any", None, {"nested": [1, None, "x"]}, []),
    ("free_text", None, "looks good", [1, None, ["text"], {"t": "x"}, True]),
    ("approval", None, False, ["yes", 1, 0, None, "true"]),
    ("single_choice", COLOURS, 1, ["1", True, 1.0, "blue", ["red"], None]),
    ("multi_choice", COLOURS, ["green", 1], ["red", ["blue"], ["red", "red"], [True], None]),
    ("form", None, {"name": "Ada", "age": 36}, [["a"], "text", None, 3]),
]


def asks(self, ctx):
    """Waits for the input ``ctx.input`` describes; returns what it got."""
    Execution.objects.create(run_id=ctx.run_id, step="asks")
    options = dict(ctx.input)
    timeout = options.pop("timeout", None)
    value = ctx.wait_for_input(
        "answer", timeout=durable.hours(timeout) if timeout else None, **options
    )
    return {"value": value}


@pytest.fixture
def asking(define):
    return define("asks_for_input", asks=step(asks))


def time_passes(run_id):
    """The input's timeout passes: its due time moved into the past in the database."""
    Run.objects.filter(id=run_id).update(due_at=timezone.now() - timedelta(seconds=1))


def waiting(asking, **options):
    run_id = durable.start(asking, options)
    drain()
    run = fresh(run_id)
    assert (run.status, run.waiting_for) == (Status.WAITING, "input:answer")
    return run_id


@pytest.mark.parametrize(("kind", "choices", "fits", "refused"), KINDS, ids=[k[0] for k in KINDS])
def test_each_kind_accepts_what_fits_and_refuses_the_rest_writing_nothing(
    asking, kind, choices, fits, refused
):
    run_id = waiting(asking, kind=kind, choices=choices, prompt=f"Your {kind}?")
    before = fresh(run_id)
    for value in refused:
        with pytest.raises(ValueError, match="input 'answer'"):
            durable.provide_input(run_id, "answer", value)
    after = fresh(run_id)
    assert (after.status, after.waiting_for, after.state) == (
        Status.WAITING,
        "input:answer",
        before.state,
    )
    assert not Event.objects.filter(run_id=run_id).exists()
    assert not Activity.objects.filter(run_id=run_id).exists()
    durable.provide_input(run_id, "answer", fits)
    drain()
    run = fresh(run_id)
    assert (run.status, run.result) == (Status.COMPLETED, {"value": fits})


def test_a_value_that_is_not_json_is_refused_for_any_kind(asking):
    run_id = waiting(asking)
    with pytest.raises(TypeError):
        durable.provide_input(run_id, "answer", {1, 2})
    assert fresh(run_id).status == Status.WAITING


def test_provide_input_still_raises_not_waiting(asking):
    run_id = durable.start(asking, {"kind": "approval"})
    with pytest.raises(durable.NotWaiting):
        durable.provide_input(run_id, "answer", True)  # not waiting yet
    drain()
    with pytest.raises(durable.NotWaiting):
        durable.provide_input(run_id, "other", True)
    durable.provide_input(run_id, "answer", True)
    with pytest.raises(durable.NotWaiting):
        durable.provide_input(run_id, "answer", "refused as late, not as the wrong kind")


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"kind": "yes_no"}, ValueError, "input kind must be one of"),
        ({"kind": "single_choice"}, ValueError, "needs choices"),
        ({"kind": "multi_choice", "choices": []}, ValueError, "at least one choice"),
        ({"kind": "single_choice", "choices": "ab"}, TypeError, "choices must be a list"),
        ({"kind": "single_choice", "choices": ["a", "a"]}, ValueError, "distinct"),
        ({"kind": "free_text", "choices": ["a"]}, ValueError, "choices are for"),
        ({"choices": ["a"]}, ValueError, "choices are for"),
        ({"on_timeout": "retry"}, ValueError, "on_timeout must be"),
        ({"prompt": 3}, TypeError, "prompt must be a str"),
    ],
)
def test_bad_arguments_raise_at_the_call(define, options, error, says):
    caught = []

    def ask(self, ctx):
        try:
            ctx.wait_for_input("answer", **options)
        except error as exc:
            caught.append(str(exc))
        return "went on"

    run_id = durable.start(define("asks_badly", ask=step(ask)))
    drain()
    assert fresh(run_id).status == Status.COMPLETED
    assert len(caught) == 1 and says in caught[0]


def test_on_timeout_resume_returns_the_timeout_value(asking):
    run_id = waiting(asking, kind="approval", timeout=2, timeout_value=False)
    assert drain() == 0
    time_passes(run_id)
    drain()
    run = fresh(run_id)
    assert (run.status, run.result) == (Status.COMPLETED, {"value": False})


def test_on_timeout_fail_fails_the_run_without_running_the_step_again(define):
    def ask(self, ctx):
        Execution.objects.create(run_id=ctx.run_id, step="ask")
        return ctx.wait_for_input(
            "sign_off", kind="approval", timeout=durable.days(2), on_timeout="fail"
        )

    # Retries don't apply: nobody answered, trying again would not change that.
    workflow = define("signs_off", ask=step(ask, retries=3))
    run_id = durable.start(workflow)
    drain()
    time_passes(run_id)
    drain()
    run = fresh(run_id)
    assert run.status == Status.FAILED
    assert run.error["type"] == "WaitTimeout"
    assert "the input 'sign_off' timed out" in run.error["message"]
    assert Execution.objects.filter(run_id=run_id).count() == 1
    with pytest.raises(durable.NotWaiting):
        durable.provide_input(run_id, "sign_off", True)
    # A retry asks again, with a fresh timeout.
    durable.retry(run_id)
    drain()
    run = fresh(run_id)
    assert (run.status, run.waiting_for) == (Status.WAITING, "input:sign_off")
    assert run.due_at > timezone.now() + timedelta(days=1)
    durable.provide_input(run_id, "sign_off", True)
    drain()
    assert (fresh(run_id).status, fresh(run_id).result) == (Status.COMPLETED, True)


def test_on_timeout_fail_does_nothing_when_the_input_came_in_time(asking):
    run_id = waiting(asking, kind="free_text", timeout=1, on_timeout="fail")
    durable.provide_input(run_id, "answer", "in time")
    time_passes(run_id)
    drain()
    assert fresh(run_id).result == {"value": "in time"}


def test_list_pending_inputs_describes_each_wait_and_filters_by_workflow(asking, define):
    other = define("asks_too", asks=step(asks))
    before = timezone.now()
    first = waiting(
        asking, kind="single_choice", choices=COLOURS, prompt="Which colour?", timeout=3
    )
    second = waiting(other, kind="approval")
    idle = durable.start(other, {})  # not waiting yet: not listed
    listed = durable.list_pending_inputs()
    assert [row["run_id"] for row in listed] == [first, second]
    row = listed[0]
    assert {k: row[k] for k in ("workflow", "name", "kind", "prompt", "choices")} == {
        "workflow": "asks_for_input",
        "name": "answer",
        "kind": "single_choice",
        "prompt": "Which colour?",
        "choices": COLOURS,
    }
    assert before <= row["waiting_since"] <= timezone.now()
    assert row["timeout_at"] - row["waiting_since"] == pytest.approx(
        timedelta(hours=3), abs=timedelta(seconds=5)
    )
    assert listed[1]["timeout_at"] is None and listed[1]["prompt"] is None
    assert [r["run_id"] for r in durable.list_pending_inputs("asks_too")] == [second]
    assert [r["run_id"] for r in durable.list_pending_inputs(asking)] == [first]
    assert async_to_sync(durable.alist_pending_inputs)(other) == durable.list_pending_inputs(other)
    assert len(durable.list_pending_inputs(limit=1)) == 1
    durable.provide_input(first, "answer", "red")
    assert [r["run_id"] for r in durable.list_pending_inputs()] == [second]
    assert idle not in [r["run_id"] for r in durable.list_pending_inputs()]
    with pytest.raises(ValueError):
        durable.list_pending_inputs(limit=0)
    with pytest.raises(TypeError):
        durable.list_pending_inputs(3)


def test_list_pending_inputs_leaves_out_runs_waiting_for_events_or_sleeping(asking, define):
    def other_waits(self, ctx):
        ctx.wait_for_any(["a", "b"])

    durable.start(define("waits_for_events", w=step(other_waits)))
    sleeping = durable.start(define("sleeps"), {"sleep": True})
    drain()
    assert fresh(sleeping).waiting_for == "sleep"
    assert durable.list_pending_inputs() == []


@pytest.mark.postgres
def test_list_pending_inputs_reads_the_workflow_status_index_of_a_big_table(asking):
    """20,000 runs, most finished or asleep, analysed: the list reads only
    waiting runs, through (workflow, status) or the index of waiting runs."""
    statuses = [Status.COMPLETED] * 8 + [Status.FAILED, Status.WAITING]
    Run.objects.bulk_create(
        Run(
            workflow=("asks_for_input", "other_a", "other_b", "other_c")[i % 4],
            status=statuses[i % 10],
            waiting_for="sleep" if statuses[i % 10] == Status.WAITING else None,
        )
        for i in range(20_000)
    )
    first = waiting(asking, kind="approval")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_run")
    for names in (["asks_for_input"], ["asks_for_input", "other_a", "other_b"]):
        plan = store.waiting_for_input(names, 1000).explain()
        # (workflow, status) ranges, or the waiting runs' own index in age order.
        assert "durable_run_workflow_status" in plan or "durable_run_waiting" in plan, plan
        assert "Seq Scan" not in plan, plan
    assert [row["run_id"] for row in durable.list_pending_inputs()] == [first]


def test_on_timeout_fail_compensates_the_steps_that_completed(define):
    def reserve(self, ctx):
        ctx.put("reserved", True)

    def ask(self, ctx):
        return ctx.wait_for_input("go", timeout=durable.hours(1), on_timeout="fail")

    def unreserve(self, ctx):
        Execution.objects.create(run_id=ctx.run_id, step="unreserve")

    workflow = define(
        "reserves_then_asks",
        reserve=step(reserve, compensate="unreserve"),
        ask=step(ask),
        unreserve=unreserve,
    )
    run_id = durable.start(workflow)
    drain()
    time_passes(run_id)
    drain()
    run = fresh(run_id)
    assert run.status == Status.COMPENSATED
    assert run.error["type"] == "WaitTimeout"
    assert list(Execution.objects.filter(run_id=run_id).values_list("step", flat=True)) == [
        "unreserve"
    ]
