"""Shared helpers: workflows defined for one test, holders in every status, and
threads that each use their own database connection."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection

import django_durable as durable
from django_durable import Workflow, step, store
from django_durable.models import Run, Status
from django_durable.operations.flow import claim_limits
from django_durable.runtime import executor
from django_durable.testing import drain
from django_durable.workflows.definition import StepDef, registry
from tests.factories import RunFactory
from tests.worker_processes import ROOT


def work(self, ctx):
    """The one step of a workflow made by ``define``: sleeps or fails when asked to."""
    if ctx.input.get("sleep"):
        ctx.sleep(durable.hours(1))
    if ctx.input.get("fail"):
        raise RuntimeError("asked to fail")
    return ctx.input.get("value")


@pytest.fixture
def define():
    """``define(name, reuse=..., on_duplicate=..., **attrs)`` makes a workflow class
    for this test only; it is unregistered when the test ends."""
    names: list[str] = []

    def make(name: str, **attrs) -> type[Workflow]:
        namespace = {"name": name, "__module__": __name__}
        if not any(isinstance(v, StepDef) for v in attrs.values()):
            namespace["work"] = step(work)
        namespace.update(attrs)
        names.append(name)
        return type("".join(p.title() for p in name.split("_")), (Workflow,), namespace)

    yield make
    for name in names:
        registry.unregister(name)


API_STATUSES = (
    Status.PENDING,
    Status.RUNNING,
    Status.WAITING,
    Status.COMPLETED,
    Status.FAILED,
    Status.CANCELLED,
)
# Compensation is not built yet: these holders are written with the factory.
FACTORY_STATUSES = (Status.COMPENSATING, Status.COMPENSATED, Status.COMPENSATION_FAILED)
ALL_STATUSES = API_STATUSES + FACTORY_STATUSES


def holder_in(workflow: type[Workflow], status: str, key: str, input: dict | None = None):
    """Make a run of ``workflow`` that holds ``key`` and is in ``status``; return its id.

    The public API gets it there where it can (start, claim, drain, cancel)."""
    input = dict(input or {})
    if status in FACTORY_STATUSES:
        return RunFactory(workflow=workflow.name, key=key, status=status, input=input).id
    if status == Status.WAITING:
        input["sleep"] = True
    if status == Status.FAILED:
        input["fail"] = True
    run_id = durable.start(workflow, input, key=key)
    if status == Status.RUNNING:
        claimed = store.claim(
            worker_id="test-worker",
            queues=None,
            limit=1,
            lease=timedelta(minutes=5),
            flow_limits=claim_limits(),
        )
        assert [run.id for run in claimed] == [run_id]
    elif status == Status.CANCELLED:
        durable.cancel(run_id, reason="test")
    elif status != Status.PENDING:
        drain()
    run = Run.objects.get(id=run_id)
    assert (run.status, run.holds_key) == (status, True), run.error
    return run_id


class DbThread(threading.Thread):
    """Run ``fn`` in a thread with its own connection; keep its result or exception."""

    def __init__(self, fn, *args, **kwargs):
        super().__init__(daemon=True)
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.result = None
        self.error: BaseException | None = None
        self.backend_pid: int | None = None
        self.connected = threading.Event()

    def run(self):
        try:
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_backend_pid()")
                    self.backend_pid = cursor.fetchone()[0]
            self.connected.set()
            self.result = self.fn(*self.args, **self.kwargs)
        except BaseException as exc:  # handed to the test thread
            self.error = exc
        finally:
            self.connected.set()
            connection.close()

    def outcome_after_start(self, timeout: float = 30):
        self.start()
        return self.outcome(timeout)

    def outcome(self, timeout: float = 30):
        self.join(timeout)
        assert not self.is_alive(), "the thread did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def wait_until_blocked_on_lock(thread: DbThread, timeout: float = 30) -> None:
    """Wait until ``thread``'s PostgreSQL backend waits for a lock held by another
    transaction (what an insert of a key another open transaction inserted does)."""
    assert thread.connected.wait(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                [thread.backend_pid],
            )
            row = cursor.fetchone()
        if row and row[0] == "Lock":
            return
        assert thread.is_alive(), f"the thread finished without waiting: {thread.error!r}"
        time.sleep(0.01)
    raise AssertionError("the thread never waited for the lock")


def run_ids(**filters) -> list[uuid.UUID]:
    return list(Run.objects.filter(**filters).order_by("created_at").values_list("id", flat=True))


LEASE = timedelta(seconds=30)


def pick_up(run_id=None, worker_id="test-worker"):
    """Claim due runs like a worker (without running them); return the one asked for."""
    claimed = store.claim(
        worker_id=worker_id, queues=None, limit=100, lease=LEASE, flow_limits=claim_limits()
    )
    if run_id is None:
        assert len(claimed) == 1, claimed
        return claimed[0]
    for run in claimed:
        if run.id == run_id:
            return run
    raise AssertionError(f"run {run_id} was not due; claimed {[r.id for r in claimed]}")


def run_claimed(run):
    """Execute a claimed run in this thread, as the worker's executor does."""
    return executor.execute(run)


def fresh(run_id) -> Run:
    return Run.objects.get(id=run_id)


def manage_py(*args: str) -> subprocess.CompletedProcess:
    """``python manage.py *args`` in a process of its own, on the test database (as a
    user runs a command line), with a deadline."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DURABLE_SUBPROCESS_DB_NAME": str(connection.settings_dict["NAME"]),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
