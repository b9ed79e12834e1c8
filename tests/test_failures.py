"""The failure contract in this process (docs/production.md, "Running safely"):
what a step's failure, an unrecordable outcome, a timeout, a lost worker and bad
input each lead to. Worker processes: tests/test_failure_processes.py."""

import threading
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

import django_durable as durable
from django_durable import store
from django_durable.models import Run, Status, StepAttempt
from django_durable.runtime import maintenance
from django_durable.runtime.context import Context
from django_durable.testing import drain
from django_durable.workflows.definition import StepDef, step
from django_durable.workflows.values import MAX_DEPTH
from tests.helpers import fresh
from tests.testapp.models import Execution
from tests.testapp.workflows_failures import BacksOff, RunsLong, StepTimesOut

pytestmark = pytest.mark.django_db


def executions(run_id, step_name="bad") -> int:
    return Execution.objects.filter(run_id=run_id, step=step_name).count()


def attempts(run_id) -> list[tuple[str, str]]:
    rows = StepAttempt.objects.filter(run_id=run_id).order_by("id")
    return [(a.status, (a.error or {}).get("type")) for a in rows]


# --- outcomes that cannot be recorded, and BaseException ------------------------------


@pytest.mark.parametrize(
    "workflow, cause",
    [
        ("returns_nul", "NUL"),
        ("puts_nul", "NUL"),
        ("puts_non_json", "JSON-serialisable"),
        ("returns_too_much", "MAX_VALUE_BYTES"),
    ],
)
def test_an_unrecordable_outcome_is_a_failed_attempt_that_follows_retries(workflow, cause):
    run_id = durable.start(workflow)
    drain()
    run = fresh(run_id)
    assert run.status == Status.FAILED
    assert executions(run_id) == 3  # retries=2: exactly three attempts
    assert [status for status, _ in attempts(run_id)] == ["failed"] * 3
    assert cause in run.error["message"]


def test_a_value_the_database_refuses_is_a_failed_attempt_with_its_cause(settings):
    # Over the size limit, but only by the database's measure: the check is the store's.
    settings.DURABLE = {"MAX_VALUE_BYTES": 100}
    run_id = durable.start("returns_too_much", {"bytes": 101})
    drain()
    run = fresh(run_id)
    assert run.status == Status.FAILED and executions(run_id) == 3
    assert "could not be recorded" in run.error["message"]
    assert "over the limit of 100" in run.error["message"]


@pytest.mark.parametrize("what", ["SystemExit", "KeyboardInterrupt", "BaseException"])
def test_a_base_exception_from_a_step_is_a_failed_attempt(what):
    run_id = durable.start("raises_base", {"what": what})
    drain()
    run = fresh(run_id)
    assert (run.status, run.error["type"]) == (Status.FAILED, what)
    assert executions(run_id) == 3


def test_ctx_put_refuses_what_is_not_json_at_the_call():
    run = Run(id=None, context={}, state={})
    ctx = Context(run, waits=[])
    with pytest.raises(TypeError, match="JSON-serialisable"):
        ctx.put("x", {1, 2})
    with pytest.raises(ValueError, match="NUL"):
        ctx.put("x", ["ok", {"deep": "a\x00"}])
    with pytest.raises(ValueError, match="surrogate"):
        ctx.put("x", "\ud800")


# --- giving up, backoff kinds -----------------------------------------------------------


@pytest.mark.parametrize("non_retryable", [True, False])
def test_non_retryable_and_give_up_on_fail_the_step_at_once(non_retryable):
    run_id = durable.start("gives_up", {"non_retryable": non_retryable})
    drain()
    run = fresh(run_id)
    assert run.status == Status.FAILED
    assert run.error["type"] == ("NonRetryable" if non_retryable else "KeyError")
    assert executions(run_id) == 1


def test_backoff_kinds_and_jitter():
    def delays(**options):
        return [
            StepDef(lambda self, ctx: None, retries=5, backoff=timedelta(seconds=2), **options)
            .delay_before(attempt)
            .total_seconds()
            for attempt in range(2, 6)
        ]

    assert delays() == [2, 4, 8, 16]
    assert delays(backoff_kind="linear") == [2, 4, 6, 8]
    assert delays(backoff_kind="constant") == [2, 2, 2, 2]
    assert delays(max_backoff=timedelta(seconds=5)) == [2, 4, 5, 5]
    jittered = delays(jitter=True)
    assert all(low / 2 <= got <= low for got, low in zip(jittered, [2, 4, 8, 16], strict=True))


@pytest.mark.parametrize(
    "options",
    [{"backoff_kind": "fibonacci"}, {"jitter": "yes"}, {"give_up_on": ("x",)}, {"timeout": 0}],
)
def test_bad_step_options_fail_at_definition(options):
    with pytest.raises(ImproperlyConfigured):
        step(**options)(lambda self, ctx: None)


# --- run and step timeouts ------------------------------------------------------------------


def test_a_backoff_never_outlasts_the_run_timeout():
    run_id = durable.start(BacksOff, key="backs-off")
    drain()
    run = fresh(run_id)
    # The next attempt would be an hour away; the run's deadline comes first.
    assert (run.status, run.due_at) == (Status.PENDING, run.timeout_at)
    Run.objects.filter(id=run_id).update(due_at=store.now(), timeout_at=store.now())
    drain()
    run = fresh(run_id)
    assert (run.status, run.error["type"], run.holds_key) == (Status.FAILED, "Timeout", True)
    assert executions(run_id, "flaky") == 1
    # after_failure: a new start takes the key of the timed-out run.
    assert durable.start(BacksOff, {"ok": True}, key="backs-off") != run_id


def test_retry_of_a_timed_out_run_gives_it_a_fresh_deadline():
    run_id = durable.start(BacksOff, key="retried")
    Run.objects.filter(id=run_id).update(timeout_at=store.now())
    drain()
    assert fresh(run_id).status == Status.FAILED
    Run.objects.filter(id=run_id).update(input={"ok": True})
    durable.retry(run_id)
    run = fresh(run_id)
    assert run.timeout_at > store.now() + timedelta(minutes=9)
    drain()
    run = fresh(run_id)
    assert (run.status, run.result, run.holds_key) == (Status.COMPLETED, "done", True)


def test_a_step_past_the_run_timeout_is_stopped_at_its_heartbeat():
    run_id = durable.start(RunsLong)
    drain(max_seconds=30)
    run = fresh(run_id)
    assert (run.status, run.error["type"]) == (Status.FAILED, "Timeout")
    assert run.result is None
    assert attempts(run_id) == [("failed", "Timeout")]


def test_an_attempt_past_the_step_timeout_fails_and_its_late_result_is_dropped():
    run_id = durable.start(StepTimesOut)
    drain()
    run = fresh(run_id)
    assert (run.status, run.error["type"], run.result) == (Status.FAILED, "StepTimeout", None)
    assert attempts(run_id) == [("failed", "StepTimeout")] * 2  # retries=1


# --- lost workers ----------------------------------------------------------------------------


def test_a_run_whose_worker_is_lost_too_often_fails_saying_so(settings):
    settings.DURABLE = {"MAX_RECOVERIES": 2}
    run_id = durable.start("steps_3", key="lost")
    for lost in range(3):
        (claimed,) = store.claim(
            worker_id=f"doomed-{lost}", queues=None, limit=1, lease=timedelta(seconds=30)
        )
        Run.objects.filter(id=run_id).update(lease_expires_at=store.now() - timedelta(seconds=1))
        recovery = maintenance.recover()
        expected = Status.PENDING if lost < 2 else Status.FAILED
        assert fresh(run_id).status == expected
    assert [r.id for r in recovery.failed] == [run_id]
    run = fresh(run_id)
    assert run.recoveries == 3
    assert "its worker was lost 3 times" in run.error["message"]
    assert run.holds_key  # a failed run keeps its key (after_close)
    assert [status for status, _ in attempts(run_id)] == ["lost"] * 3
    durable.retry(run_id)
    assert fresh(run_id).recoveries == 0
    drain()
    assert fresh(run_id).status == Status.COMPLETED


def test_a_worker_claims_only_the_workflows_it_has():
    old = durable.start("added_in_this_release")
    known = durable.start("steps_3")
    claimed = store.claim(
        worker_id="old-release",
        queues=None,
        limit=10,
        lease=timedelta(seconds=30),
        workflows=["steps_3"],
    )
    assert [run.id for run in claimed] == [known]
    assert fresh(old).status == Status.PENDING


# --- ctx.start --------------------------------------------------------------------------------


def test_ctx_start_in_a_step_that_waits_twice_starts_one_run():
    run_id = durable.start("starts_and_waits")
    drain()
    durable.send_event(run_id, "first")
    drain()
    durable.send_event(run_id, "second")
    drain()
    run = fresh(run_id)
    assert run.status == Status.COMPLETED
    assert executions(run_id, "kick_off") == 3
    started = Run.objects.filter(workflow="noop", input={"from": str(run_id)})
    assert [str(r.id) for r in started] == [run.result]


# --- bad input -------------------------------------------------------------------------------


def nested(depth):
    value = "leaf"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "payload, error",
    [
        ({"text": "a\x00b"}, ValueError),
        ({"a\x00": 1}, ValueError),
        ({"text": "\udc80"}, ValueError),
        ({"deep": nested(5000)}, ValueError),
        ({"when": {1, 2}}, TypeError),
    ],
)
def test_bad_input_raises_before_anything_is_written(payload, error):
    with pytest.raises(error):
        durable.start("steps_3", payload)
    with pytest.raises(error):
        durable.start("steps_3", {"fine": True, "inner": [payload]})
    assert not Run.objects.exists()


def test_nesting_up_to_the_limit_is_accepted():
    durable.start("steps_3", {"deep": nested(MAX_DEPTH - 2)})
    with pytest.raises(ValueError, match="nested deeper"):
        durable.start("steps_3", {"deep": nested(MAX_DEPTH)})


@pytest.mark.parametrize(
    "name, payload",
    [("go\x00", None), ("x" * 201, None), ("go", "a\x00"), ("go", "\ud800"), ("go", nested(5000))],
)
def test_bad_event_names_and_payloads_raise_value_error(name, payload):
    run_id = durable.start("starts_and_waits")
    drain()
    with pytest.raises(ValueError):
        durable.send_event(run_id, name, payload)
    assert fresh(run_id).status == Status.WAITING


@pytest.mark.parametrize("by", ["ops\x00", "\ud800", "x" * 201, float("nan"), 3])
def test_release_key_by_must_be_a_short_string(by):
    run_id = durable.start("steps_3", key="k")
    drain()
    with pytest.raises(ValueError):
        durable.release_key(run_id, by=by)
    assert fresh(run_id).holds_key


# --- pruning on several nodes -----------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_three_concurrent_prunes_report_the_exact_total(settings):
    settings.DURABLE = {"PRUNE_BATCH_SIZE": 50}
    old = store.now() - timedelta(days=60)
    Run.objects.bulk_create(
        Run(workflow="steps_3", status=Status.COMPLETED, finished_at=old, created_at=old)
        for _ in range(600)
    )
    counts: list[int] = []
    barrier = threading.Barrier(3)

    def prune():
        try:
            barrier.wait()
            counts.append(durable.prune())
        finally:
            connection.close()

    threads = [threading.Thread(target=prune) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(counts) == 3 and sum(counts) == 600
    assert not Run.objects.exists()
