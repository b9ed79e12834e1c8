"""django-tasks-db, Django's own Tasks framework with the database backend (the
``django-tasks`` backport on Django 5.2), measured as its docs run it.

- ``tasksdb_enqueue``: ``noop.enqueue(i)`` from web code, ops/s (it has no key or
  dedupe of any kind: a second enqueue is a second task)
- ``tasksdb_worker``: the queued tasks through one ``manage.py db_worker --batch``
  (it runs one task at a time; there is no concurrency option), tasks/s from the
  first start to the last finish (database timestamps)
- ``tasksdb_worker_x4``: four ``db_worker`` processes at once, the nearest to a
  concurrency of 4
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings_tasks"

import django  # noqa: E402

from bench.common import Results, rate, recreate_database, stopwatch, suite_args, wanted  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def setup(db: str) -> None:
    recreate_database(db)
    os.environ["BENCH_DB_NAME"] = db
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def truncate() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_tasks_database_dbtaskresult")


def enqueue(results: Results, n: int) -> None:
    from bench.tasks_peer import noop

    with stopwatch() as elapsed:
        for i in range(n):
            noop.enqueue(i)
    results.add("tasksdb_enqueue", rate(n, elapsed()), "ops/s")


def bulk(n: int) -> None:
    from bench.tasks_peer import noop

    for i in range(n):
        noop.enqueue(i)


def workers(n: int, processes: int) -> float:
    from django.db import connection

    command = [
        sys.executable,
        str(ROOT / "manage.py"),
        "db_worker",
        "--batch",
        "--no-startup-delay",
        "-v",
        "0",
    ]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings_tasks"}
    running = [subprocess.Popen(command, cwd=ROOT, env=env) for _ in range(processes)]
    codes = [p.wait(timeout=900) for p in running]
    if any(codes):
        raise RuntimeError(f"db_worker exited {codes}")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'), "
            "EXTRACT(EPOCH FROM max(finished_at) - min(started_at)) "
            "FROM django_tasks_database_dbtaskresult"
        )
        done, seconds = cursor.fetchone()
    if done != n:
        raise RuntimeError(f"{done} of {n} tasks succeeded")
    return rate(n, float(seconds))


def main() -> None:
    args = suite_args(__doc__)
    results = Results()
    setup(args.db)
    for repeat in range(args.repeats):
        print(f"django-tasks-db, repeat {repeat + 1}", flush=True)
        truncate()
        if wanted(args, "tasksdb_enqueue", "tasksdb_worker"):
            results.measure(["tasksdb_enqueue"], lambda: enqueue(results, args.n))
        if wanted(args, "tasksdb_worker"):
            results.measure(
                ["tasksdb_worker"],
                lambda: results.add("tasksdb_worker", workers(args.n, 1), "tasks/s"),
            )
        if wanted(args, "tasksdb_worker_x4"):
            truncate()
            bulk(args.n)
            results.measure(
                ["tasksdb_worker_x4"],
                lambda: results.add("tasksdb_worker_x4", workers(args.n, 4), "tasks/s"),
            )
    results.write(args.out)


if __name__ == "__main__":
    main()
