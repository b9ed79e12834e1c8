"""What the worker says (issue 32, case 4): a failed run's line has the exception's
type and message (its traceback once, with the failure), names the step and the
attempt; the start-up line names what the worker serves, truthfully; ``--burst``
says what is due and why it leaves it; before ``migrate``, the worker, ``start()``,
the dashboard and ``manage.py durable`` say to run ``migrate``.

From a real ``Worker`` (its threads and their own connections) read with caplog,
and from real ``manage.py`` processes against a database nobody migrated."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection

import django_durable as durable
from django_durable import store
from django_durable.models import Run
from django_durable.runtime import telling
from django_durable.runtime.worker import Worker
from django_durable.store import schema
from tests.factories import RunFactory
from tests.testapp.workflows import Noop, SyncAccount

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def said(caplog):
    caplog.set_level(logging.DEBUG, logger="django_durable")

    def lines(text: str, level: int | None = None) -> list[logging.LogRecord]:
        return [
            r
            for r in caplog.records
            if text in r.getMessage() and (level is None or r.levelno == level)
        ]

    return lines


def burst(**options) -> Worker:
    worker = Worker(burst=True, worker_id=f"teller-{uuid.uuid4().hex[:6]}", **options)
    assert worker.run(install_signal_handlers=False) == 0
    return worker


def charge(self, ctx):
    raise ValueError("card declined")


def work(self, ctx):
    if ctx.attempt == 1:
        raise KeyError("not yet")
    return "ok"


# --- a failed run --------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_failed_run_is_logged_with_its_step_attempt_and_exception(define, said):
    workflow = define(
        "tells_charge", charge=durable.step(retries=2, backoff=durable.seconds(0))(charge)
    )
    run_id = durable.start(workflow)
    burst()
    failure = f"run {run_id} (tells_charge) failed in step 'charge' (attempt 3 of 3): "
    failure += "ValueError: card declined"
    (error,) = said(failure, logging.ERROR)
    assert error.exc_info is not None  # the traceback, once for the run
    assert "card declined" in "".join(__import__("traceback").format_exception(*error.exc_info))
    # Said once above INFO: the worker's own line for the claim is at DEBUG (and says
    # where and why, not "failed after 1 step(s)").
    failed = f"run {run_id} (tells_charge) failed in step 'charge'"
    assert [r.levelno for r in said(failed)] == [logging.ERROR, logging.DEBUG]
    assert not said("failed after")
    # The attempts before it: a WARNING with type and message and the next attempt;
    # the traceback at DEBUG.
    retries = said("step 'charge' failed (attempt", logging.WARNING)
    assert [r.getMessage().split(": ", 1)[1] for r in retries] == [
        "ValueError: card declined; attempt 2 due now",
        "ValueError: card declined; attempt 3 due now",
    ]
    assert all(r.exc_info is None for r in retries)
    assert len([r for r in said("traceback", logging.DEBUG) if r.exc_info]) == 2


@pytest.mark.django_db(transaction=True)
def test_a_retry_later_says_when(define, said):
    flaky = define("tells_flaky", work=durable.step(retries=1, backoff=durable.hours(1))(work))
    run_id = durable.start(flaky)
    burst()
    (line,) = said(f"run {run_id} (tells_flaky) step 'work' failed (attempt 1 of 2): KeyError:")
    assert "'not yet'; attempt 2 at " in line.getMessage()
    assert line.attempt == 2  # the record's field names the attempt to come


@pytest.mark.django_db(transaction=True)
def test_a_run_that_fails_by_its_timeout_is_logged(define, said):
    waits = define(
        "tells_timeout",
        timeout=durable.seconds(30),
        work=durable.step(lambda self, ctx: ctx.wait_for_event("never")),
    )
    run_id = durable.start(waits)
    burst()
    Run.objects.filter(id=run_id).update(timeout_at=store.now(), due_at=store.now())
    burst()
    timed_out = f"run {run_id} (tells_timeout) failed: Timeout: the run passed its timeout"
    assert len(said(timed_out, logging.ERROR)) == 1
    assert len(said(timed_out, logging.DEBUG)) == 1  # the worker's line for the claim


# --- what a worker serves ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("served", "registered", "expected"),
    [
        (
            None,
            ["a", "b"],
            "serves every workflow: the 2 defined here (a, b) and any other name a finder imports",
        ),
        (
            ([], []),
            [],
            "serves no workflow: none is defined in this process",
        ),
        (
            ([], ["task:"]),
            [],
            "serves no workflow defined in its code, only those found by name: task:*",
        ),
        (
            (["a", "b"], ["task:"]),
            ["a", "b"],
            "serves the 2 workflows a, b and every Django task (runs of other",
        ),
        (
            (["process_article"], ["task:"]),
            ["process_article"],
            "serves the workflow process_article and every Django task (runs",
        ),
    ],
)
def test_the_served_line_says_what_the_worker_claims(served, registered, expected):
    assert expected in telling.served(served, registered)


def test_a_worker_with_no_workflow_says_so_and_where_they_come_from(tmp_path):
    (tmp_path / "bare_settings.py").write_text(
        "from tests.settings import *  # noqa\n"
        "INSTALLED_APPS = [a for a in INSTALLED_APPS if a != 'tests.testapp']\n"
        "TASKS = {}\n"
    )
    done = manage(tmp_path, "durable_worker", "--burst", settings="bare_settings", migrated=True)
    assert done.returncode == 0, done.stderr
    assert "serves no workflow: none is defined in this process" in done.stderr
    assert "workflows.py" in done.stderr
    assert "(any)" not in done.stderr


# --- --burst -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_burst_with_nothing_due_says_so_and_when_the_next_run_is_due(said):
    durable.start(Noop, run_after=timedelta(hours=2))
    burst()
    (line,) = said("nothing is due, stopping (burst)")
    assert "the next run is due at" in line.getMessage()


@pytest.mark.django_db(transaction=True)
def test_burst_says_what_is_due_and_why_it_leaves_it(settings, said):
    settings.DURABLE = {"QUEUES": {"limited": {"concurrency": 1}}}
    durable.pause_queue("held")
    durable.start(Noop, queue="held")
    durable.start(Noop, queue="elsewhere")
    RunFactory(workflow="not_in_this_code")
    durable.start(Noop, queue="limited")
    durable.start(Noop, queue="limited")
    # One run of the limited queue is running on another worker: the queue is full.
    (busy,) = store.claim(
        worker_id="other", queues=["limited"], limit=1, lease=timedelta(minutes=5)
    )
    burst(queues=["default", "held", "limited"])
    (line,) = said("nothing it may claim is due, stopping (burst)")
    message = line.getMessage()
    assert "1 due run(s) of noop in queue held: the queue is paused" in message
    assert "durable resume held" in message
    assert "1 due run(s) in queue elsewhere, which this worker does not serve (--queues)" in (
        message
    )
    assert "1 due run(s) of not_in_this_code in queue default: this worker does not have" in (
        message
    )
    limited = "1 due run(s) of noop in queue limited: the queue is at its concurrency limit"
    assert f"{limited} (1 of 1" in message
    assert Run.objects.get(id=busy.id).status == "running"


# --- before migrate --------------------------------------------------------------------------


def manage(tmp_path, *args, settings="tests.settings", migrated=False, code=None):
    """``manage.py`` in a process of its own, against the test database (``migrated``)
    or against a database nobody migrated."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": settings,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "DURABLE_SUBPROCESS_DB_NAME": (
            str(connection.settings_dict["NAME"]) if migrated else unmigrated_database(tmp_path)
        ),
    }
    command = [sys.executable, str(ROOT / "manage.py"), *args]
    if code is not None:
        command = [sys.executable, str(ROOT / "manage.py"), "shell", "-c", code]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def unmigrated_database(tmp_path) -> str:
    """An empty database: a new SQLite file, or a new PostgreSQL database (dropped by
    the ``empty_postgres`` fixture)."""
    if connection.vendor != "postgresql":
        return str(tmp_path / "never_migrated.sqlite3")
    return EMPTY_PG


EMPTY_PG = f"{os.environ.get('DURABLE_TEST_DB_NAME', 'test_django_durable')}_unmigrated"


@pytest.fixture
def empty_database():
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{EMPTY_PG}"')
            cursor.execute(f'CREATE DATABASE "{EMPTY_PG}"')
    yield
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{EMPTY_PG}" WITH (FORCE)')


RUN_MIGRATE = "python manage.py migrate"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_before_migrate_every_entry_point_says_to_run_it(tmp_path, empty_database):
    worker = manage(tmp_path, "durable_worker", "--burst")
    assert worker.returncode == 1, worker.stderr
    assert RUN_MIGRATE in worker.stderr
    assert "Traceback" not in worker.stderr

    started = manage(tmp_path, code="import django_durable as d; d.start('sync_account')")
    assert "django_durable.exceptions.NotMigrated" in started.stderr, started.stderr
    assert RUN_MIGRATE in started.stderr

    listed = manage(tmp_path, "durable", "list")
    assert listed.returncode == 1, listed.stderr
    assert RUN_MIGRATE in listed.stderr
    assert "Traceback" not in listed.stderr

    doctor = manage(tmp_path, "durable", "doctor")  # doctor still runs, and says it too
    assert "migrate" in doctor.stdout + doctor.stderr


@pytest.mark.django_db
def test_the_dashboard_says_to_run_migrate_instead_of_failing(admin_client):
    from django.db.migrations.recorder import MigrationRecorder

    MigrationRecorder.Migration.objects.filter(app="django_durable").delete()
    schema.forget()
    try:
        response = admin_client.get("/admin/durable/runs/")
    finally:
        schema.forget()
    assert response.status_code == 503
    assert RUN_MIGRATE in response.content.decode()


@pytest.mark.django_db(transaction=True)
def test_start_in_a_migrated_database_checks_nothing_more(django_assert_num_queries):
    durable.start(SyncAccount, {})  # the first start may set the connection up
    with django_assert_num_queries(1):
        durable.start(SyncAccount, {})
