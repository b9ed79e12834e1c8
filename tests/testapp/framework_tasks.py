"""Task functions for tests/test_tasks_framework.py: the shapes the Tasks framework's
reference backends test with (django-tasks, django-tasks-db), written for a durable
backend. The same file serves Django 6 (django.tasks) and 5.2 (the backport)."""

import threading

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

from django_durable.tasks import durable_task

# A task that holds its worker until the test lets it go (in-process workers only).
release = threading.Event()
entered = threading.Event()


@task
def noop(*args, **kwargs):
    return None


@task
async def noop_async(*args, **kwargs):
    return None


@task
def meaning_of_life():
    return 42


@task
def fails_with_value_error():
    raise ValueError("this task failed with a ValueError")


@task
def fails_with_nested_error():
    raise ValueError(ValueError("the inner failure"))


@task
def returns_a_set():
    return {1, 2, 3}


@task
def exits():
    raise SystemExit(3)


@task(takes_context=True)
def own_id(context):
    return context.task_result.id


@task(takes_context=True)
def what_it_sees(context):
    seen = context.task_result
    return {
        "attempt": context.attempt,
        "status": str(seen.status),
        "worker_ids": seen.worker_ids,
        "last_attempted_at": seen.last_attempted_at.isoformat() if seen.last_attempted_at else None,
    }


@task
@durable_task(retries=1, backoff=0)
def fails_once_then_fails_again():
    raise RuntimeError("every attempt fails")


@task
def holds_until_released():
    entered.set()
    if not release.wait(60):
        raise TimeoutError("the test never released this task")
    return "released"


class PaymentDeclined(Exception):
    """An exception of the project's own, not a builtin."""


@task
def declines():
    raise PaymentDeclined("card declined")


@task
def echo(value):
    return value


@task(takes_context=True)
def echo_with_context(context, value, *, times=1):
    return [value] * times
