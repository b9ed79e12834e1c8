"""A worker killed (SIGKILL) in the middle of a compensation: the run stays
compensating, keeps its key, and another worker finishes the compensations."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from django.db import connection

import django_durable as durable
from django_durable import store
from django_durable.models import Run, StepAttempt
from django_durable.testing import drain
from tests.testapp.models import SideEffect
from tests.testapp.workflows_engine import HangingUndo

ROOT = Path(__file__).resolve().parent.parent

WORKER = textwrap.dedent(
    """
    from datetime import timedelta
    import django
    django.setup()
    from django.conf import settings
    settings.DURABLE = {"LEASE": timedelta(seconds=2), "HEARTBEAT_INTERVAL": timedelta(seconds=1)}
    from django_durable.testing import drain
    drain(max_seconds=600)
    """
)


def wait_until(predicate, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_killed_worker_s_compensation_is_recovered_and_finished():
    run_id = durable.start(HangingUndo, key="trip:9")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DURABLE_TEST_DB": "postgres",
        "PGDATABASE": connection.settings_dict["NAME"],
    }
    worker = subprocess.Popen([sys.executable, "-c", WORKER], cwd=ROOT, env=env)
    try:
        assert wait_until(
            lambda: SideEffect.objects.filter(run_id=run_id, step="undo-started").exists()
        )
        run = durable.get_run(run_id)
        assert run.status == "compensating" and run.worker_id.startswith("drain-")
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()

    # Still compensating and holding the key while nobody works on it.
    with pytest.raises(durable.NotCancellable):
        durable.cancel(run_id)
    assert durable.get_run(run_id).holds_key
    # Its 2-second lease runs out; recovery makes it due, still compensating.
    assert wait_until(lambda: run_id in store.recover_expired_leases(), seconds=30)
    run = durable.get_run(run_id)
    assert run.status == "compensating" and run.worker_id is None
    drain()
    run = durable.get_run(run_id)
    assert run.status == "compensated"
    assert run.error["message"] == "payment refused"
    attempts = list(
        StepAttempt.objects.filter(run_id=run_id, kind="compensation")
        .order_by("id")
        .values_list("attempt", "status")
    )
    assert attempts == [(1, "lost"), (2, "completed")]
    assert SideEffect.objects.filter(run_id=run_id, step="undo-finished").count() == 1
    assert Run.objects.filter(workflow="hanging_undo").count() == 1
