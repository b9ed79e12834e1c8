"""Parallel branches finishing at the same moment on several threads wake the
parent once it is due, and never lose the wake."""

import threading

import pytest
from django.db import connection

import django_durable as durable
from django_durable.models import Run
from django_durable.testing import drain
from tests.testapp.models import SideEffect
from tests.testapp.workflows_engine import Fanout


def drain_in_thread(errors):
    try:
        drain(max_seconds=60)
    except Exception as exc:  # reported to the test below
        errors.append(exc)
    finally:
        connection.close()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_branches_run_on_three_threads_and_the_parent_gets_every_result():
    parents = [durable.start(Fanout, {"ns": list(range(1, 7))}) for _ in range(3)]
    errors: list[Exception] = []
    threads = [threading.Thread(target=drain_in_thread, args=(errors,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for parent_id in parents:
        parent = durable.get_run(parent_id)
        assert parent.status == "completed", parent.error
        assert parent.result == [2, 4, 6, 8, 10, 12]
        assert Run.objects.filter(parent_id=parent_id).count() == 6
    # Every branch ran its step once (SideEffect is unique per run and step).
    assert SideEffect.objects.filter(step="double").count() == 18
