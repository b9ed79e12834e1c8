"""Every log record the engine writes about a run carries its fields (run_id,
workflow, key, and where known step, attempt, queue, worker_id), from a real worker
(the ``Worker`` object, its threads and their own connections) and from ``drain()``."""

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection

import django_durable as durable
from django_durable import step, telemetry
from django_durable.models import Run
from django_durable.runtime.worker import Worker
from django_durable.testing import drain
from tests.test_docs_async_and_logs import python_blocks
from tests.testapp.workflows import Flaky

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def records(caplog):
    caplog.set_level(logging.DEBUG, logger="django_durable")

    def about(run_id, text=None):
        found = [
            r
            for r in caplog.records
            if getattr(r, "run_id", None) == str(run_id)
            and (text is None or text in r.getMessage())
        ]
        return found

    return about


def fields(record):
    return {name: getattr(record, name) for name in telemetry.LOG_FIELDS if hasattr(record, name)}


def wobble(self, ctx):
    if ctx.attempt == 1:
        raise ValueError("first attempt fails")
    return "ok"


def test_started_retried_and_failed_runs_are_logged_with_their_fields(define, records):
    ok = define("logged_ok")
    retried = define("logged_retry", work=step(retries=1, backoff=durable.seconds(0))(wobble))
    failing = define("logged_fail", queue="chores")
    ok_id = durable.start(ok, {"value": 1}, key="order:1")
    retry_id = durable.start(retried)
    fail_id = durable.start(failing, {"fail": True}, key="order:2")
    worker = Worker(concurrency=2, burst=True, worker_id="fields-worker")
    assert worker.run(install_signal_handlers=False) == 0

    (started,) = records(ok_id, "started: step 0, attempt 1")
    assert fields(started) == {
        "run_id": str(ok_id),
        "workflow": "logged_ok",
        "key": "order:1",
        "step": "work",
        "attempt": 1,
        "queue": "default",
        "worker_id": "fields-worker",
    }
    (done,) = records(ok_id, "completed after 1 step(s)")
    assert fields(done)["worker_id"] == "fields-worker"

    # The retry's record names the attempt to come, as its message does; the run is
    # no worker's any more (it waits for its next claim).
    (retry,) = records(retry_id, "step 'wobble' failed (attempt 1 of 2): ValueError")
    assert fields(retry) == {
        "run_id": str(retry_id),
        "workflow": "logged_retry",
        "key": None,
        "step": "wobble",
        "attempt": 2,
        "queue": "default",
    }
    assert [r.attempt for r in records(retry_id, "started")] == [1, 2]

    # The failure itself (at ERROR, with its traceback); the worker's line for the
    # claim says it too, with the same fields.
    failure = "failed in step 'work' (attempt 1 of 1): RuntimeError: asked to fail"
    (failed,) = [r for r in records(fail_id, failure) if r.levelno == logging.ERROR]
    assert failed.exc_info is not None
    assert fields(failed) == {
        "run_id": str(fail_id),
        "workflow": "logged_fail",
        "key": "order:2",
        "step": "work",
        "attempt": 1,
        "queue": "chores",
        "worker_id": "fields-worker",
    }


SPINNING = threading.Event()


def spin(self, ctx):
    SPINNING.set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ctx.heartbeat()  # raises Cancelled once the run is cancelled
        time.sleep(0.02)
    return "never cancelled"


def test_a_cancelled_run_is_logged_with_its_fields_by_the_cancel_and_the_worker(define, records):
    SPINNING.clear()
    spinner = define("logged_spinner", work=step(spin))
    run_id = durable.start(spinner, key="spin:1")
    worker = Worker(concurrency=1, worker_id="spin-worker", poll_interval=0.05)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        assert SPINNING.wait(30), "the worker never started the step"
        durable.cancel(run_id, reason="customer left")
        deadline = time.monotonic() + 30
        while not records(run_id, "it is cancelled now") and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        worker.stop()
        thread.join(30)
    (cancel,) = records(run_id, "cancelled: customer left")
    assert fields(cancel) == {
        "run_id": str(run_id),
        "workflow": "logged_spinner",
        "key": "spin:1",
        "step": "spin",
        "attempt": 1,
        "queue": "default",
        "worker_id": "spin-worker",
    }
    (stopped,) = records(run_id, "stopped: it is cancelled now")
    assert fields(stopped)["worker_id"] == "spin-worker"
    assert fields(stopped)["key"] == "spin:1"


def test_drain_logs_with_the_fields_too(define, records):
    failing = define("drained_fail")
    run_id = durable.start(failing, {"fail": True}, key="drained:1")
    drain()
    (failed,) = records(run_id, "failed in step 'work'")
    assert fields(failed)["workflow"] == "drained_fail"
    assert fields(failed)["key"] == "drained:1"
    assert fields(failed)["worker_id"].startswith("drain-")


def test_a_field_the_query_deferred_is_left_out_not_loaded(define, django_assert_num_queries):
    run_id = durable.start(define("deferred_fields"), key="d:1")
    run = Run.objects.only("id", "workflow", "key").get(id=run_id)
    with django_assert_num_queries(0):
        found = telemetry.log_fields(run)
    assert found == {"run_id": str(run_id), "workflow": "deferred_fields", "key": "d:1"}


def test_the_json_logging_example_of_the_docs_runs_in_a_durable_worker(tmp_path):
    """docs/observability.md, "Log fields": its formatter and filter, in a project
    module, configured by its LOGGING, write JSON lines with the run's fields from a
    real ``manage.py durable_worker --burst`` process."""
    classes, config = python_blocks("observability.md", "Log fields")
    namespace: dict = {}
    exec(classes, namespace)
    assert namespace["LOG_FIELDS"] == telemetry.LOG_FIELDS  # the doc names every field
    (tmp_path / "myproject").mkdir()
    (tmp_path / "myproject" / "__init__.py").write_text("")
    (tmp_path / "myproject" / "logs.py").write_text(classes)
    (tmp_path / "json_settings.py").write_text("from tests.settings import *  # noqa\n" + config)
    run_id = durable.start(Flaky, {"failures": 1}, key="json:1")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "json_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "DURABLE_SUBPROCESS_DB_NAME": str(connection.settings_dict["NAME"]),
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "durable_worker", "--burst"]
        + ["--worker-id", "json-worker"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert Run.objects.get(id=run_id).status == "completed"
    # The console handler writes JSON lines; the file keeps only the run's records.
    printed = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert any("worker json-worker started" in line["message"] for line in printed)
    lines = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert lines and all(line["run_id"] == str(run_id) for line in lines)
    retry = next(line for line in lines if "; attempt 2 " in line["message"])
    assert (retry["workflow"], retry["key"], retry["step"], retry["attempt"]) == (
        "flaky",
        "json:1",
        "wobble",
        2,
    )
    assert retry["level"] == "WARNING"  # a failed attempt, with its type and message
    started = [line for line in lines if "started: step" in line["message"]]
    assert [(line["attempt"], line["worker_id"]) for line in started] == [
        (1, "json-worker"),
        (2, "json-worker"),
    ]
