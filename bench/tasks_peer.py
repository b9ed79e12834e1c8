"""The task the django-tasks-db peer enqueues (importable by ``db_worker``)."""

from django_tasks import task


@task()
def noop(i: int = 0) -> None:
    return None
