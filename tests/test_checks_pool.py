"""django_durable.W003: Django's connection pool must hold what a worker holds.

A worker holds ``--concurrency + 4`` connections of DURABLE["DATABASE"] (execution
threads, dispatcher, heartbeat, maintenance, the recorder of last steps; 3 without
the recorder, ``COMPLETION_BATCH = 1``), + 1 when it LISTENs through the same
alias. The system check judges the default concurrency; the worker logs the same
warning at start for its real one, and runs at exactly that size.
"""

import pytest
from django.core.checks import run_checks

import django_durable as durable
from django_durable.checks import pool_max_size, pool_size_warnings, worker_start_warnings
from django_durable.models import Status
from tests.testapp.workflows import Noop
from tests.worker_processes import wait_until

POSTGRES = {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}


def with_pool(pool):
    return {"default": {**POSTGRES, "OPTIONS": {"pool": pool}}, "direct": POSTGRES}


def ids(messages):
    return [m.id for m in messages]


@pytest.mark.parametrize(
    ("options", "size"),
    [
        (None, None),
        ({}, None),
        ({"pool": False}, None),
        ({"pool": True}, 4),  # psycopg_pool's default: min_size 4, max_size = min_size
        ({"pool": {"max_size": 10}}, 10),
        ({"pool": {"min_size": 2}}, 2),
        ({"pool": {"min_size": 6, "max_size": None}}, 6),
    ],
)
def test_the_pool_size_is_read_as_psycopg_pool_reads_it(options, size):
    assert pool_max_size(options) == size


@pytest.mark.parametrize(
    ("concurrency", "pool", "listen", "warned"),
    [
        (1, True, "default", True),  # 1 + 4 + 1 = 6 > 4
        (1, True, "direct", True),  # 1 + 4 = 5 > 4
        (1, {"max_size": 5}, None, False),  # 1 + 4 = 5
        (1, {"max_size": 6}, "default", False),
        (8, {"max_size": 12}, "direct", False),
        (8, {"max_size": 12}, "default", True),  # 13 needed
        (8, {"max_size": 11}, "direct", True),
    ],
)
def test_a_pool_smaller_than_the_worker_is_warned_about(
    settings, concurrency, pool, listen, warned
):
    settings.DURABLE = {"LISTEN_DATABASE": listen}
    warnings = pool_size_warnings(concurrency, with_pool(pool))
    assert ids(warnings) == (["django_durable.W003"] if warned else [])


@pytest.mark.parametrize(("batch", "needed"), [(50, 6), (2, 6), (1, 5)])
def test_the_recorder_holds_a_connection_unless_batches_are_off(settings, batch, needed):
    """The recorder of last steps (COMPLETION_BATCH > 1) is one more connection."""
    settings.DURABLE = {"COMPLETION_BATCH": batch, "LISTEN_DATABASE": "direct"}
    assert pool_size_warnings(2, with_pool({"max_size": needed})) == []
    (warning,) = pool_size_warnings(2, with_pool({"max_size": needed - 1}))
    assert f"needs {needed} connections" in warning.msg


def test_the_warning_says_what_is_needed(settings):
    settings.DURABLE = {}
    (check,) = pool_size_warnings(1, with_pool(True), default_concurrency=True)
    assert "default --concurrency 1 needs 6 connections of DATABASES['default']" in check.msg
    assert "at most 4" in check.msg and "max_size" in check.hint
    (start,) = pool_size_warnings(6, with_pool({"max_size": 8}))
    assert start.msg.startswith("durable_worker --concurrency 6 needs 11 connections")


def test_the_pool_of_durables_own_database_is_the_one_that_counts(settings):
    settings.DURABLE = {"DATABASE": "direct", "LISTEN_DATABASE": "direct"}
    assert pool_size_warnings(8, with_pool({"max_size": 2})) == []
    databases = {"default": POSTGRES, "direct": {**POSTGRES, "OPTIONS": {"pool": True}}}
    assert ids(pool_size_warnings(1, databases)) == ["django_durable.W003"]


def test_without_a_pool_nothing_is_warned():
    assert "django_durable.W003" not in ids(run_checks())
    assert "django_durable.W003" not in ids(worker_start_warnings(64, False))


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_with_too_small_a_pool_says_so_at_start(workers):
    worker = workers.start("--concurrency", "4", test_pool_max_size=4)
    worker.wait_for_output("durable_worker --concurrency 4 needs 9 connections", timeout=60)
    lines = worker.output().splitlines()
    logged = next(line for line in lines if "--concurrency 4 needs 9" in line)
    assert " WARNING " in logged and "[django_durable.W003]" in logged
    # Django's system checks, run before the command, judged the default concurrency.
    assert any(
        "(django_durable.W003)" in line and "default --concurrency 1" in line for line in lines
    )
    worker.send(15)
    worker.wait(90)


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_with_a_pool_of_exactly_the_size_it_needs(workers):
    """--concurrency 3 with LISTEN on the same alias: 3 + 4 + 1 = 8 connections."""
    run_ids = [durable.start(Noop) for _ in range(30)]
    worker = workers.start("--concurrency", "3", test_pool_max_size=8)
    wait_until(
        lambda: all(durable.get_run(i).status == Status.COMPLETED for i in run_ids),
        120,
        "every run completed",
        interval=0.2,
    )
    worker.send(15)
    assert worker.wait(60) == 0
    output = worker.output()
    assert "listening for NOTIFY" in output
    assert [line for line in output.splitlines() if " WARNING " in line or "ERROR" in line] == []
