"""django-durable behind PgBouncer in transaction pooling mode, with its default settings.

Each test starts its own PgBouncer (tests/pgbouncer.py) in front of the test
database. Producer processes (tests/producer.py) and ``durable_worker`` processes
reach the database through it, as on hosts where PgBouncer's transaction mode is
the default; only the LISTEN connection goes straight to PostgreSQL
(``DURABLE["LISTEN_DATABASE"] = "direct"``), as docs/production.md says it must.
The last tests point LISTEN at PgBouncer too, and show the worker saying so and
still finishing every run by polling.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
from django.db import connection
from django.db.models import Count

from django_durable.models import Run, Status
from tests.pgbouncer import PgBouncer
from tests.testapp.models import SideEffect
from tests.testapp.workflows import KeyedOnce
from tests.worker_processes import ROOT, WorkerProcess, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

KEYS = 200


@pytest.fixture
def bouncer(tmp_path):
    directory = tmp_path / "pgbouncer"
    directory.mkdir()
    server_port = int(connection.settings_dict["PORT"] or 5432)
    bouncer = PgBouncer(directory, pool_mode="transaction", server_port=server_port)
    yield bouncer
    bouncer.stop()


@pytest.fixture
def processes():
    started: list[WorkerProcess] = []
    yield started
    for process in started:
        process.kill()


def through(bouncer: PgBouncer, *, listen: str = "direct") -> dict[str, str]:
    """The environment of a process whose "default" database is reached through PgBouncer."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DURABLE_SUBPROCESS_DB_NAME": str(connection.settings_dict["NAME"]),
        "DURABLE_TEST_PORT": str(bouncer.port),
        "DURABLE_TEST_DIRECT_PORT": str(connection.settings_dict["PORT"] or 5432),
        "DURABLE_TEST_LISTEN_DATABASE": listen,
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def start_worker(processes, tmp_path, env, *args: str) -> WorkerProcess:
    worker = WorkerProcess(list(args), env, tmp_path / f"worker-{len(processes)}.log")
    processes.append(worker)
    return worker


def produce(env, seeds: list[int], keys: int) -> list[dict]:
    """Run one producer process per seed at the same time; return what each printed."""
    producers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.producer", "--keys", str(keys), "--seed", str(seed)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in seeds
    ]
    reports = []
    for producer in producers:
        out, err = producer.communicate(timeout=300)
        assert producer.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def problems(log: str) -> list[str]:
    """Lines of a worker's log that report something going wrong."""
    return [
        line
        for line in log.splitlines()
        if " ERROR " in line or " WARNING " in line or "Traceback" in line
    ]


def runs_of_keyed_once():
    return Run.objects.filter(workflow=KeyedOnce.name)


def test_keyed_starts_and_a_worker_through_pgbouncer_in_transaction_mode(
    bouncer, processes, tmp_path
):
    env = through(bouncer)
    worker = start_worker(processes, tmp_path, env, "--concurrency", "4")
    worker.wait_for_output("listening for NOTIFY", timeout=60)

    # 2 producers x 200 keyed starts on the same 200 keys: half of the starts are
    # duplicates, many of them racing the other process's start of the same key.
    first, second = produce(env, seeds=[1, 2], keys=KEYS)

    assert first["errors"] == [] and second["errors"] == []
    outcomes = Counter(first["outcomes"]) + Counter(second["outcomes"])
    assert outcomes == {"started": KEYS, "use_existing": KEYS}
    assert first["answered"] == second["answered"]  # both got the same run for every key
    assert len(set(first["answered"].values())) == KEYS

    runs = runs_of_keyed_once()
    assert runs.count() == KEYS
    per_key = runs.filter(holds_key=True).values("key").annotate(n=Count("id"))
    assert sorted(row["key"] for row in per_key) == sorted(first["answered"])
    assert {row["n"] for row in per_key} == {1}  # one holder per key

    wait_until(
        lambda: runs.filter(status=Status.COMPLETED).count() == KEYS,
        180,
        "every run completed by the worker behind PgBouncer",
        interval=0.2,
    )
    assert SideEffect.objects.filter(step="record").count() == KEYS  # each step ran once
    worker.send(15)  # SIGTERM
    assert worker.wait(60) == 0
    assert problems(worker.output()) == []
    assert "received no NOTIFY" not in worker.output()


def test_a_listen_through_pgbouncer_in_transaction_mode_is_reported_and_runs_still_complete(
    bouncer, processes, tmp_path
):
    env = through(bouncer, listen="default")
    worker = start_worker(processes, tmp_path, env, "--concurrency", "2")
    worker.wait_for_output("received no NOTIFY", timeout=60)
    warning = next(line for line in worker.output().splitlines() if "received no NOTIFY" in line)
    assert " WARNING " in warning
    assert "DURABLE['LISTEN_DATABASE']" in warning and "DATABASES['default']" in warning
    assert "listening for NOTIFY" not in worker.output()

    # Producers' NOTIFYs never reach that LISTEN; the worker finds the runs by polling.
    (report,) = produce(env, seeds=[3], keys=20)
    assert report["errors"] == [] and report["outcomes"] == {"started": 20}
    wait_until(
        lambda: runs_of_keyed_once().filter(status=Status.COMPLETED).count() == 20,
        120,
        "the runs completed by polling",
        interval=0.2,
    )
    worker.send(15)
    assert worker.wait(60) == 0
    assert [line for line in problems(worker.output()) if line != warning] == []


def test_listen_works_says_no_through_pgbouncer_and_yes_directly(bouncer):
    env = through(bouncer)
    code = (
        "from django_durable.runtime.notifier import listen_works; "
        "print(listen_works(alias='default', timeout=3), listen_works(alias='direct'))"
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].split() == ["False", "True"]
