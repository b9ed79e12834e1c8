"""``durable_worker`` as the Tasks framework's users know ``db_worker``: --max-tasks,
--exclude-queues, the framework's log lines in a real worker's output, a clean exit
on SIGTERM at any moment of its start, and the check for a missing app.

Ported from django-tasks-db's DatabaseBackendWorkerTestCase and
DatabaseWorkerProcessTestCase (rewritten for durable_worker), plus the cases of
issue 32 (case 11) that are about the worker command.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.utils import timezone

from django_durable.models import Run, WorkerNode
from tests.testapp import framework_tasks as tasks
from tests.worker_processes import ROOT, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def statuses(results) -> list[str]:
    for result in results:
        result.refresh()
    return sorted(str(result.status) for result in results)


# --- --max-tasks ---------------------------------------------------------------------


def test_max_tasks_exits_after_that_many_runs(workers):
    """Issue 32 case 11: no counterpart to db_worker's --max-tasks."""
    results = [tasks.noop.enqueue() for _ in range(5)]
    worker = workers.start("--max-tasks", "2", "--poll-interval", "0.2")
    assert worker.wait(60) == 0, worker.output()
    assert statuses(results) == ["READY"] * 3 + ["SUCCESSFUL"] * 2
    assert "2 runs executed" in worker.output()


def test_max_tasks_with_burst_stops_at_whichever_comes_first(workers):
    results = [tasks.noop.enqueue() for _ in range(2)]
    worker = workers.start("--max-tasks", "5", "--burst", "--concurrency", "2")
    assert worker.wait(60) == 0, worker.output()
    assert statuses(results) == ["SUCCESSFUL"] * 2


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_max_tasks_must_be_a_whole_number_of_at_least_1(value):
    with pytest.raises(CommandError, match="max-tasks"):
        call_command("durable_worker", "--max-tasks", value)


# --- --exclude-queues ----------------------------------------------------------------


def test_exclude_queues_serves_every_other_queue(workers):
    """Issue 32 case 11: no counterpart to db_worker's --exclude-queues."""
    default = tasks.noop.enqueue()
    other = tasks.noop.using(queue_name="reports").enqueue()
    excluded = tasks.noop.using(queue_name="emails").enqueue()
    worker = workers.start("--exclude-queues", "emails", "--burst")
    assert worker.wait(60) == 0, worker.output()
    assert statuses([default, other]) == ["SUCCESSFUL"] * 2
    assert statuses([excluded]) == ["READY"]


def test_excluding_a_queue_nobody_uses_serves_them_all(workers):
    results = [tasks.noop.enqueue(), tasks.noop.using(queue_name="reports").enqueue()]
    worker = workers.start("--exclude-queues", "nothing-here", "--burst")
    assert worker.wait(60) == 0, worker.output()
    assert statuses(results) == ["SUCCESSFUL"] * 2


def test_exclude_queues_cannot_be_combined_with_queues():
    with pytest.raises(CommandError, match="--exclude-queues"):
        call_command("durable_worker", "--queues", "default", "--exclude-queues", "emails")


# --- the framework's log lines in a worker's output ----------------------------------


def test_a_worker_prints_the_frameworks_task_lines_with_the_traceback(workers):
    ok = tasks.noop.enqueue()
    failing = tasks.fails_with_value_error.enqueue()
    worker = workers.start("--burst")
    assert worker.wait(60) == 0, worker.output()
    output = worker.output()
    ok_path, failing_path = tasks.noop.module_path, tasks.fails_with_value_error.module_path
    assert f"Task id={ok.id} path={ok_path} state=RUNNING" in output
    assert f"Task id={ok.id} path={ok_path} state=SUCCESSFUL" in output
    assert f"Task id={failing.id} path={failing_path} state=FAILED" in output
    failed_at = output.index(f"Task id={failing.id} path={failing_path} state=FAILED")
    assert "Traceback" in output[failed_at:]
    assert "ValueError: this task failed with a ValueError" in output[failed_at:]
    # The framework's line carries the traceback: the worker's own says the failure
    # once, without a second traceback, and names no internal step.
    assert output.count("Traceback (most recent call last)") == 1, output
    assert "_run_task" not in output, output


def test_a_task_path_that_no_longer_imports_fails_with_import_error(workers):
    result = tasks.noop.enqueue()
    Run.objects.filter(id=result.id).update(workflow="task:tests.testapp.framework_tasks.gone")
    worker = workers.start("--burst")
    assert worker.wait(60) == 0, worker.output()
    run = Run.objects.get(id=result.id)
    assert run.status == "failed" and "ImportError" in run.error["traceback"]


# --- SIGTERM at any moment of the start ----------------------------------------------


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (Linux: /proc SigCgt)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) & (1 << (signum - 1)))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("after", [0.0, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8])
def test_sigterm_at_any_moment_after_the_command_catches_it_exits_cleanly(workers, after):
    """From the moment the command catches SIGTERM (its first statement) through
    checks, option parsing, connecting, registering and running: exit 0, no traceback."""
    worker = workers.start()
    wait_until(
        lambda: catches(worker.proc.pid, signal.SIGTERM) or worker.proc.poll() is not None,
        60,
        "the worker to catch SIGTERM",
        interval=0.001,
    )
    time.sleep(after)
    worker.send(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output()
    assert "Traceback" not in worker.output()


@pytest.mark.postgres
def test_sigterm_while_the_worker_registers_exits_cleanly(workers):
    """Issue 32 case 11: a worker signalled before its handlers were installed died
    with -15. Its registration is held on a row lock, so the signal lands there."""
    WorkerNode.objects.create(
        id="held-at-start",
        hostname="elsewhere",
        pid=1,
        queues=[],
        concurrency=1,
        started_at=timezone.now() - timedelta(hours=1),
        heartbeat_at=timezone.now() - timedelta(hours=1),
    )
    holder = connections.create_connection("default")
    try:
        with holder.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(
                "SELECT id FROM durable_worker_node WHERE id = %s FOR UPDATE", ["held-at-start"]
            )
            worker = workers.start("--worker-id", "held-at-start")

            def waits_on_the_lock():
                if worker.proc.poll() is not None:
                    raise AssertionError(worker.output())
                with connection.cursor() as look:
                    # This test's database only: the other tests of the run (and
                    # their lock waits) are on databases of their own.
                    look.execute(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    )
                    return look.fetchone()[0] > 0

            wait_until(waits_on_the_lock, 60, "the worker to wait for the lock")
            worker.send(signal.SIGTERM)
            time.sleep(0.2)  # the signal is handled, not only delivered, before the release
            cursor.execute("ROLLBACK")
    finally:
        holder.close()
    assert worker.wait(60) == 0, worker.output()
    assert "Traceback" not in worker.output()
    assert "stopped (0 runs executed)" in worker.output()


# --- the system check when the app is missing ----------------------------------------


def test_check_reports_the_missing_app_in_a_project_without_it(tmp_path):
    """Issue 32 case 11: no system check fired when django_durable was missing."""
    (tmp_path / "noapp_settings.py").write_text(
        textwrap.dedent(
            f"""
            SECRET_KEY = "check"
            INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "shop"]
            DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3",
                                      "NAME": {str(tmp_path / "db.sqlite3")!r}}}}}
            TASKS = {{"default": {{"BACKEND": "django_durable.tasks.DurableBackend"}}}}
            USE_TZ = True
            """
        )
    )
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "models.py").write_text(
        textwrap.dedent(
            """
            try:
                from django.tasks import task
            except ImportError:
                from django_tasks import task


            @task
            def ship(order_id):
                return order_id
            """
        )
    )
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}",
        "DJANGO_SETTINGS_MODULE": "noapp_settings",
    }
    done = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "django_durable.E017" in done.stderr
    assert "INSTALLED_APPS" in done.stderr
