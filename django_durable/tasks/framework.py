"""The Tasks framework's names, from Django 6's ``django.tasks`` or, on Django 5.2,
the ``django-tasks`` backport (the same API under another package). ``normalize_json``
is the framework's own (``django.utils.json`` / ``django_tasks.utils``): what every
backend makes of a task's arguments and return value."""

from django.core.exceptions import ImproperlyConfigured

try:
    from django.tasks import task
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.checks import check_tasks
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    LOGGER_NAME = "django.tasks"  # where the framework logs its task lines
except ImportError:  # Django 5.2: the backport package
    try:
        from django_tasks import task
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus

        # Imported, its check_tasks is registered: backends' checks run even when
        # "django_tasks" is not in INSTALLED_APPS (Django 6 registers it the same way).
        from django_tasks.checks import check_tasks
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json

        LOGGER_NAME = "django_tasks"
    except ImportError as exc:
        raise ImproperlyConfigured(
            "django_durable.tasks needs Django's Tasks framework: Django 6's django.tasks, "
            "or on Django 5.2 the backport (pip install 'django-durable-workflows[tasks]')."
        ) from exc

__all__ = [
    "LOGGER_NAME",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "check_tasks",
    "normalize_json",
    "task_enqueued",
    "task_finished",
    "task",
    "task_started",
]
