"""The Tasks framework's own expectations of a backend, run against DurableBackend.

Ported (rewritten for a durable backend, not copied) from the reference backends'
suites: django-tasks' tests/tests/test_tasks.py and test_immediate_backend.py, and
django-tasks-db's tests/tests.py (DatabaseBackendTestCase and the parts of
DatabaseBackendWorkerTestCase that are about a task's result rather than about
db_worker's own table). The worker-command ports are in test_tasks_worker.py.
The same tests run on Django 6 (django.tasks) and 5.2 (the django-tasks backport).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from datetime import datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import connection, connections, transaction
from django.test import override_settings
from django.utils import timezone

import django_durable as durable
from django_durable.models import Run, Status
from django_durable.tasks import (
    DurableBackend,
    TaskResultDoesNotExist,
    TaskResultStatus,
    framework,
)
from django_durable.testing import drain
from tests.testapp import framework_tasks as tasks

pytestmark = pytest.mark.django_db

# The framework's logger: "django.tasks" on Django 6, "django_tasks" for the backport.
FRAMEWORK_LOGGER = framework.LOGGER_NAME


@pytest.fixture
def received():
    """What task_enqueued, task_started and task_finished were sent with, in order."""
    seen: list[tuple[str, type, object]] = []
    receivers = {}
    for name in ("task_enqueued", "task_started", "task_finished"):

        def receiver(sender, task_result, _name=name, **kwargs):
            seen.append((_name, sender, task_result))

        receivers[name] = receiver
        getattr(framework, name).connect(receiver, weak=False)
    try:
        yield seen
    finally:
        for name, receiver in receivers.items():
            getattr(framework, name).disconnect(receiver)


def backend() -> DurableBackend:
    return tasks.noop.get_backend()


# --- the backend and enqueue ---------------------------------------------------------


def test_the_default_backend_is_durable_with_its_alias_and_options():
    assert isinstance(backend(), DurableBackend)
    assert backend().alias == "default"
    assert backend().options == {}
    assert list(backend().check()) == []


@pytest.mark.parametrize("task", [tasks.noop, tasks.noop_async], ids=["sync", "async"])
def test_enqueue_returns_a_ready_result_and_sends_task_enqueued(task, received):
    result = task.enqueue(1, two=3)

    assert uuid.UUID(result.id)
    assert result.status == TaskResultStatus.READY and not result.is_finished
    assert result.started_at is None and result.finished_at is None
    assert result.last_attempted_at is None
    assert result.enqueued_at is not None
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert result.task == task
    assert (result.args, result.kwargs) == ([1], {"two": 3})
    assert result.attempts == 0 and result.errors == []
    assert received == [("task_enqueued", DurableBackend, result)]


def test_aenqueue_returns_the_same_result_as_aget_result(received):
    async def enqueue_then_read():
        result = await tasks.noop_async.aenqueue()
        return result, await tasks.noop_async.aget_result(result.id)

    result, read = async_to_sync(enqueue_then_read)()
    assert result == read
    assert received == [("task_enqueued", DurableBackend, result)]


def test_the_result_enqueue_returns_equals_get_result():
    """Issue 32 case 11: enqueue()'s result had a second now() as enqueued_at."""
    result = tasks.noop.enqueue()
    assert backend().get_result(result.id) == result
    assert result.enqueued_at == Run.objects.get(id=result.id).created_at


def test_refresh_keeps_enqueued_at_and_reads_the_finished_run():
    result = tasks.meaning_of_life.enqueue()
    enqueued_at = result.enqueued_at
    result.refresh()
    assert result.enqueued_at == enqueued_at and result.status == TaskResultStatus.READY

    drain()
    assert result.status == TaskResultStatus.READY and result.attempts == 0  # not yet read
    result.refresh()
    assert result.enqueued_at == enqueued_at
    assert result.status == TaskResultStatus.SUCCESSFUL and result.is_finished
    assert result.return_value == 42 and result.attempts == 1
    assert result.started_at >= result.enqueued_at
    assert result.finished_at >= result.started_at
    assert result.last_attempted_at >= result.started_at


def test_arefresh_reads_the_finished_run():
    result = tasks.meaning_of_life.enqueue()
    drain()
    async_to_sync(result.arefresh)()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 42


def test_an_unknown_or_malformed_id_does_not_exist():
    for result_id in (str(uuid.uuid4()), "123"):
        with pytest.raises(TaskResultDoesNotExist):
            backend().get_result(result_id)
        with pytest.raises(TaskResultDoesNotExist):
            async_to_sync(backend().aget_result)(result_id)


def test_the_check_reports_a_missing_app():
    """Issue 32 case 11: no system check when django_durable is not installed."""
    installed = [app for app in settings.INSTALLED_APPS if app != "django_durable"]
    with override_settings(INSTALLED_APPS=installed):
        errors = list(backend().check())
        through_the_framework = list(framework.check_tasks())
    assert [error.id for error in errors] == ["django_durable.E017"]
    assert "INSTALLED_APPS" in errors[0].hint and "django_durable" in errors[0].hint
    assert errors[0] in through_the_framework


def test_enqueue_logs_the_frameworks_debug_line(caplog):
    with caplog.at_level(logging.DEBUG, logger=FRAMEWORK_LOGGER):
        result = tasks.noop.enqueue()
    lines = [r.getMessage() for r in caplog.records if r.name == FRAMEWORK_LOGGER]
    assert len(lines) == 1 and "enqueued" in lines[0] and result.id in lines[0]


def test_a_queue_the_backend_does_not_list_is_refused_at_enqueue():
    """Validated again at enqueue, against the backend as configured then (without
    QUEUES, DurableBackend takes any queue name: docs/tasks.md)."""

    def durable_backend(*queues):
        return {"default": {"BACKEND": "django_durable.tasks.DurableBackend", "QUEUES": queues}}

    with override_settings(TASKS=durable_backend("default", "elsewhere")):
        elsewhere = tasks.noop.using(queue_name="elsewhere")
    refused = pytest.raises(framework.InvalidTask, match="Queue 'elsewhere' is not valid")
    with override_settings(TASKS=durable_backend("default")), refused:
        elsewhere.enqueue()
    assert not Run.objects.exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_enqueue_inside_a_transaction_is_seen_by_others_after_commit():
    def runs_seen_elsewhere() -> int:
        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM durable_run")
                return cursor.fetchone()[0]
        finally:
            other.close()

    with transaction.atomic():
        result = tasks.noop.enqueue()
        assert result.enqueued_at is not None
        assert Run.objects.count() == 1
        assert runs_seen_elsewhere() == 0
    assert runs_seen_elsewhere() == 1


# --- run_after ------------------------------------------------------------------


def test_run_after_round_trips_through_get_result_and_refresh():
    """Issue 32 case 11: a deferred task's result lost its run_after."""
    later = timezone.now() + timedelta(hours=10)
    result = tasks.noop.using(run_after=later).enqueue()
    assert result.task.run_after == later

    read = backend().get_result(result.id)
    assert read.task.run_after == later and read == result
    result.refresh()
    assert result.task.run_after == later

    again = read.task.enqueue()  # re-enqueueing the read task keeps the delay
    assert durable.get_run(again.id).due_at >= later
    assert drain() == 0


def test_a_task_without_run_after_reads_back_none():
    result = tasks.noop.enqueue()
    assert backend().get_result(result.id).task.run_after is None


def test_a_deferred_task_runs_once_its_time_comes():
    result = tasks.noop.using(run_after=timezone.now() + timedelta(hours=10)).enqueue()
    assert drain() == 0
    assert drain(run_timers=True) == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


# --- what the worker reports ------------------------------------------------------


def test_a_failed_task_has_its_exception_class_and_traceback():
    result = tasks.fails_with_value_error.enqueue()
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.started_at >= result.enqueued_at
    assert result.finished_at >= result.started_at
    assert result.last_attempted_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert result.errors[0].exception_class is ValueError
    assert (
        result.errors[0]
        .traceback.rstrip()
        .endswith("ValueError: this task failed with a ValueError")
    )


def test_a_nested_exception_is_kept_in_the_traceback():
    result = tasks.fails_with_nested_error.enqueue()
    drain()
    result.refresh()
    assert result.errors[0].exception_class is ValueError
    assert "ValueError: the inner failure" in result.errors[0].traceback


def test_a_return_value_that_is_not_json_fails_the_task_with_type_error():
    result = tasks.returns_a_set.enqueue()
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is TypeError
    # The framework's normalize_json refused it, as on every other backend.
    assert "TypeError: Unsupported type: <class 'set'>" in result.errors[0].traceback


# What the framework's normalize_json makes of a value, on every backend.
NORMALISED = [
    pytest.param((1, (2, 3)), id="tuples"),
    pytest.param(b"bytes", id="bytes"),
    pytest.param({"a": (b"x", None, 1.5, True)}, id="nested"),
]


@pytest.mark.parametrize("value", NORMALISED)
def test_return_values_and_arguments_come_back_as_the_framework_normalises_them(value):
    result = tasks.echo.enqueue(value)
    assert result.args == [framework.normalize_json(value)]
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == framework.normalize_json(value)
    assert tasks.echo.get_result(result.id).args == [framework.normalize_json(value)]


def test_arguments_the_framework_refuses_fail_with_its_message_and_write_nothing():
    with pytest.raises(TypeError, match="Unsupported type: <class 'object'>"):
        tasks.echo.enqueue(object())
    with pytest.raises(ValueError, match="Unsupported value"):
        tasks.echo.enqueue(b"\xff")
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("task", "args", "kwargs", "words"),
    [
        (tasks.echo, (1, 2, 3), {}, "too many positional arguments"),
        (tasks.echo, (), {}, "missing a required argument: 'value'"),
        (tasks.echo, (1,), {"other": 2}, "unexpected keyword argument 'other'"),
        (tasks.echo, (1,), {"value": 2}, "multiple values for argument 'value'"),
        (tasks.echo_with_context, (1, 2), {}, "too many positional arguments"),
        (tasks.echo_with_context, (), {"times": 2}, "missing a required argument: 'value'"),
        (tasks.meaning_of_life, (1,), {}, "too many positional arguments"),
    ],
)
def test_arguments_the_function_does_not_take_are_refused_at_enqueue(task, args, kwargs, words):
    with transaction.atomic():
        with pytest.raises(TypeError, match=words):
            task.enqueue(*args, **kwargs)
        with pytest.raises(TypeError, match=words):
            async_to_sync(task.aenqueue)(*args, **kwargs)
        assert not Run.objects.exists()
        # The caller's transaction goes on.
        assert tasks.noop.enqueue(*args, **kwargs).status == TaskResultStatus.READY


def test_arguments_a_function_takes_are_enqueued():
    assert tasks.echo.enqueue(value=1).kwargs == {"value": 1}
    assert tasks.echo_with_context.enqueue(1, times=2).args == [1]
    assert Run.objects.count() == 2
    drain()
    assert tasks.echo_with_context.get_result(
        Run.objects.get(input__kwargs__times=2).id
    ).return_value == [1, 1]


def test_system_exit_in_a_task_fails_the_task_not_the_worker():
    result = tasks.exits.enqueue()
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is SystemExit


def test_a_task_that_takes_context_sees_its_own_id():
    result = tasks.own_id.enqueue()
    drain()
    result.refresh()
    assert result.return_value == result.id


def test_the_context_sees_a_running_result_with_this_attempt():
    result = tasks.what_it_sees.enqueue()
    drain()
    result.refresh()
    seen = result.return_value
    assert seen["attempt"] == 1 and seen["status"] == TaskResultStatus.RUNNING
    assert seen["worker_ids"] == result.worker_ids and len(seen["worker_ids"]) == 1
    # The attempt's first record is written as the step begins, a moment after the
    # executor's reading of the attempt's start that its final record keeps.
    seen_last_attempted_at = datetime.fromisoformat(seen["last_attempted_at"])
    assert result.last_attempted_at <= seen_last_attempted_at <= result.finished_at


def test_each_attempt_is_counted_with_its_worker_and_error():
    result = tasks.fails_once_then_fails_again.enqueue()
    drain(run_timers=True)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 2 and len(result.errors) == 2
    assert all(worker for worker in result.worker_ids)


@pytest.mark.django_db(transaction=True)
def test_a_running_task_shows_its_attempt_worker_and_when_it_began():
    """Issue 32 case 11: a RUNNING result said attempts 0, no worker, never attempted."""
    tasks.release.clear()
    tasks.entered.clear()
    result = tasks.holds_until_released.enqueue()
    drained: list[int] = []

    def work():
        try:
            drained.append(drain(max_seconds=60))
        finally:
            connection.close()

    worker = threading.Thread(target=work)
    worker.start()
    try:
        assert tasks.entered.wait(30), "the task never started"
        result.refresh()
        assert result.status == TaskResultStatus.RUNNING
        assert result.attempts == 1
        assert result.worker_ids == [durable.get_run(result.id).worker_id]
        assert result.last_attempted_at is not None
        assert result.last_attempted_at >= result.started_at
    finally:
        tasks.release.set()
        worker.join(60)
    assert drained == [1]
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 1
    assert Run.objects.get(id=result.id).attempts.filter(status="running").count() == 0


# --- task_started / task_finished and the framework's log lines ---------------------


def test_task_started_and_task_finished_are_sent_around_a_successful_task(received):
    """Issue 32 case 11: no task_started / task_finished were sent."""
    result = tasks.meaning_of_life.enqueue()
    drain()
    names = [name for name, _sender, _result in received]
    assert names == ["task_enqueued", "task_started", "task_finished"]
    _, sender, started = received[1]
    assert sender is DurableBackend
    assert started.id == result.id and started.status == TaskResultStatus.RUNNING
    assert started.attempts == 1 and started.last_attempted_at is not None
    _, sender, finished = received[2]
    assert sender is DurableBackend
    assert finished.status == TaskResultStatus.SUCCESSFUL and finished.return_value == 42


def test_task_finished_is_sent_once_after_the_last_failed_attempt(received):
    result = tasks.fails_once_then_fails_again.enqueue()
    drain(run_timers=True)
    names = [name for name, _sender, _result in received]
    assert names == ["task_enqueued", "task_started", "task_started", "task_finished"]
    finished = received[-1][2]
    assert finished.id == result.id and finished.status == TaskResultStatus.FAILED
    assert finished.attempts == 2 and len(finished.errors) == 2
    assert finished.errors[-1].exception_class is RuntimeError


def test_the_frameworks_log_lines_with_the_failed_tasks_traceback(caplog):
    ok = tasks.meaning_of_life.enqueue()
    failing = tasks.fails_with_value_error.enqueue()
    with caplog.at_level(logging.INFO, logger=FRAMEWORK_LOGGER):
        drain()
    lines = {
        (record.getMessage(), record.levelno): record
        for record in caplog.records
        if record.name == FRAMEWORK_LOGGER
    }
    ok_path, failing_path = (
        tasks.meaning_of_life.module_path,
        tasks.fails_with_value_error.module_path,
    )
    assert (f"Task id={ok.id} path={ok_path} state=RUNNING", logging.INFO) in lines
    assert (f"Task id={ok.id} path={ok_path} state=SUCCESSFUL", logging.INFO) in lines
    assert (f"Task id={failing.id} path={failing_path} state=RUNNING", logging.INFO) in lines
    failed = lines[(f"Task id={failing.id} path={failing_path} state=FAILED", logging.ERROR)]
    assert failed.exc_info and failed.exc_info[0] is ValueError
    assert "this task failed with a ValueError" in caplog.text


# --- a task path that does not import -------------------------------------------


def test_a_task_path_that_does_not_import_raises_import_error():
    """Issue 32 case 11: LookupError where the framework's backends raise ImportError."""
    # A run of a task whose function is gone since (renamed, deleted by a deploy).
    run_id = tasks.noop.enqueue().id
    Run.objects.filter(id=run_id).update(workflow="task:tests.testapp.framework_tasks.gone")
    with pytest.raises(ImportError):
        backend().get_result(str(run_id))
    drain()
    run = Run.objects.get(id=run_id)
    assert run.status == Status.FAILED
    assert "ImportError" in run.error["traceback"]


def test_an_exception_class_of_the_projects_own_is_found_from_its_module():
    result = tasks.declines.enqueue()
    drain()
    result.refresh()
    assert result.errors[0].exception_class is tasks.PaymentDeclined


def test_a_receiver_that_raises_is_logged_and_does_not_fail_the_task(caplog):
    def broken(sender, task_result, **kwargs):
        raise RuntimeError("the receiver is broken")

    framework.task_finished.connect(broken, weak=False)
    try:
        result = tasks.meaning_of_life.enqueue()
        with caplog.at_level(logging.ERROR, logger="django_durable.tasks"):
            drain()
    finally:
        framework.task_finished.disconnect(broken)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 1
    assert "a receiver of the task signal failed" in caplog.text
    assert "the receiver is broken" in caplog.text


# --- the Task API through this backend (django-tasks' test_tasks.py) -------------------


def test_arguments_that_are_not_json_are_refused_before_anything_is_written():
    with pytest.raises(TypeError):
        tasks.noop.enqueue(datetime.now())
    with pytest.raises(TypeError):
        async_to_sync(tasks.noop.aenqueue)(datetime.now())
    assert not Run.objects.exists()


def test_refresh_of_a_task_nobody_ran_changes_nothing():
    result = tasks.noop.enqueue()
    before = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == before
    async_to_sync(result.arefresh)()
    assert dataclasses.asdict(result) == before


def test_a_naive_run_after_is_refused():
    with pytest.raises(framework.InvalidTask, match="run_after must be an aware datetime"):
        tasks.noop.using(run_after=datetime.now())


def test_priority_is_a_whole_number_from_minus_100_to_100():
    for bad in (-101, 101, 3.1):
        with pytest.raises(framework.InvalidTask, match="priority must be a whole number"):
            tasks.noop.using(priority=bad)
    for good in (-100, 0, 100):
        result = tasks.noop.using(priority=good).enqueue()
        assert durable.get_run(result.id).priority == good
        assert backend().get_result(result.id).task.priority == good


def test_get_result_through_another_task_is_a_mismatch():
    result = tasks.noop_async.enqueue()
    with pytest.raises(framework.TaskResultMismatch, match="Task does not match"):
        tasks.noop.get_result(result.id)
    with pytest.raises(framework.TaskResultMismatch, match="Task does not match"):
        async_to_sync(tasks.noop.aget_result)(result.id)


def test_only_module_level_functions_and_a_context_argument_make_tasks():
    def inner():
        return None

    with pytest.raises(framework.InvalidTask, match="defined at a module level"):
        framework.task()(inner)
    with pytest.raises(framework.InvalidTask, match="first argument of 'context'"):
        framework.task(takes_context=True)(tasks.meaning_of_life.func)
