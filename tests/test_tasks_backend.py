"""django_durable.tasks.DurableBackend with Django's Tasks framework.

The same tests run on Django 6 (django.tasks) and on 5.2 (the django-tasks backport):
the task functions in tests/testapp/tasks.py import whichever is there.
"""

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

import django_durable as durable
from django_durable.models import Run, Status
from django_durable.tasks import (
    DurableBackend,
    TaskResultDoesNotExist,
    TaskResultStatus,
    durable_task,
    task_status,
)
from django_durable.testing import drain
from django_durable.workflows.definition import registry
from tests.testapp import tasks
from tests.worker_processes import WorkerPool

pytestmark = pytest.mark.django_db


def test_the_configured_backend_is_durable():
    assert isinstance(tasks.add.get_backend(), DurableBackend)


def test_enqueue_starts_a_run_whose_id_is_the_result_id():
    result = tasks.add.enqueue(2, 3)
    run = durable.get_run(result.id)
    assert (run.workflow, run.status) == ("task:tests.testapp.tasks.add", Status.PENDING)
    assert run.input == {"args": [2, 3], "kwargs": {}}
    assert result.status == TaskResultStatus.READY and not result.is_finished

    assert drain() == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.attempts == 1 and result.finished_at is not None
    assert tasks.add.get_result(result.id).return_value == 5


def test_a_duplicate_enqueue_with_a_key_returns_the_holders_result():
    first = tasks.process_article.enqueue(42, note="first")
    second = tasks.process_article.enqueue(42, note="second")
    assert second.id == first.id
    assert second.kwargs == {"note": "first"}  # the holder's arguments
    assert Run.objects.filter(key="article:42").count() == 1

    drain()
    third = tasks.process_article.enqueue(42, note="third")
    assert third.id == first.id and third.return_value == {"article": 42, "note": "first"}
    other = tasks.process_article.enqueue(43)
    assert other.id != first.id


def test_a_keyed_task_with_on_duplicate_error_raises_key_taken():
    first = tasks.charge.enqueue(7)
    with pytest.raises(durable.KeyTaken) as taken:
        tasks.charge.enqueue(7)
    assert str(taken.value.holder_id) == first.id


def test_a_failed_task_reports_its_errors_after_its_retries():
    result = tasks.explode.enqueue()
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 3  # retries=2
    assert [e.exception_class for e in result.errors] == [ValueError] * 3
    assert "the task failed" in result.errors[-1].traceback
    with pytest.raises(ValueError):
        result.return_value  # noqa: B018


def test_a_cancelled_run_is_a_failed_task():
    result = tasks.add.enqueue(1, 1)
    durable.cancel(result.id, reason="not needed")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is durable.Cancelled


def test_queue_name_is_the_runs_queue():
    result = tasks.send_email.enqueue("ann@example.com")
    assert durable.get_run(result.id).queue == "emails"
    assert tasks.send_email.get_result(result.id).task.queue_name == "emails"


def test_context_and_async_task_functions():
    with_context = tasks.attempt_number.enqueue()
    doubled = tasks.async_double.enqueue(21)
    drain()
    assert tasks.attempt_number.get_result(with_context.id).return_value == 1
    assert tasks.async_double.get_result(doubled.id).return_value == 42


def test_aenqueue_and_aget_result():
    async def enqueue_and_read():
        result = await tasks.add.aenqueue(20, 22)
        return result, await tasks.add.aget_result(result.id)

    result, read = async_to_sync(enqueue_and_read)()
    assert read.id == result.id and read.status == TaskResultStatus.READY
    drain()
    assert async_to_sync(tasks.add.aget_result)(result.id).return_value == 42


def test_get_result_of_an_unknown_id_or_a_plain_run_does_not_exist():
    backend = tasks.add.get_backend()
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result("not-a-uuid")
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result("00000000-0000-0000-0000-000000000000")
    plain = durable.start("sync_account", {})
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(str(plain))


def test_arguments_that_are_not_json_are_refused_before_anything_is_written():
    with pytest.raises(TypeError):
        tasks.add.enqueue(object(), 1)
    assert not Run.objects.exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_process_that_never_imported_the_task_finds_it_by_name(tmp_path):
    """The worker's apps import workflows.py modules, not tests/testapp/tasks.py: it
    finds the task through the module path in its workflow's name."""
    result = tasks.add.enqueue(1, 2)
    workers = WorkerPool(tmp_path)
    try:
        worker = workers.start("--burst")
        assert worker.wait(60) == 0, worker.output()
    finally:
        workers.kill_all()
    assert tasks.add.get_result(result.id).return_value == 3


def test_an_unregistered_task_workflow_is_found_again():
    result = tasks.add.enqueue(1, 2)
    registry.unregister("task:tests.testapp.tasks.add")
    drain()
    assert tasks.add.get_result(result.id).return_value == 3


def test_bad_durable_task_options_fail_at_definition():
    with pytest.raises(ImproperlyConfigured):
        durable_task(reuse="sometimes")
    with pytest.raises(ImproperlyConfigured):
        durable_task(on_duplicate="maybe")
    with pytest.raises(ImproperlyConfigured):
        durable_task(key="article:1")
    with pytest.raises(ImproperlyConfigured):
        durable_task(reuse="never", on_duplicate="run_again")
    with pytest.raises(ImproperlyConfigured):
        durable_task(tasks.add)


def test_run_statuses_map_to_task_statuses():
    assert {s: task_status(s) for s in Status.values} == {
        "pending": "READY",
        "waiting": "READY",
        "running": "RUNNING",
        "compensating": "RUNNING",
        "completed": "SUCCESSFUL",
        "failed": "FAILED",
        "cancelled": "FAILED",
        "compensated": "FAILED",
        "compensation_failed": "FAILED",
    }


def test_run_after_delays_the_run():
    later = timezone.now() + timedelta(hours=1)
    result = tasks.add.using(run_after=later).enqueue(1, 2)
    assert durable.get_run(result.id).due_at >= later
    assert drain() == 0


def test_priority_is_the_runs_priority():
    low = tasks.add.using(priority=-5).enqueue(1, 1)
    high = tasks.add.using(priority=50).enqueue(2, 2)
    assert durable.get_run(high.id).priority == 50
    assert durable.get_run(low.id).priority == -5
