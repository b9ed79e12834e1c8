"""Where a worker's time goes per run: statements, commits and round trips per
one-step run at concurrency 4, counted in the worker process itself.

    python -m bench.profile_worker [--n 5000] [--workflow bench_one_step]

Runs ``durable_worker --burst --concurrency 4`` in this process over ``--n`` due
runs, with an execute wrapper (Django's documented ``execute_wrappers``) on every
connection the worker opens, and reads ``pg_stat_database`` before and after for
commits. For where the CPU goes, run the same under ``py-spy record -f raw``.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import threading
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.db.backends.signals import connection_created  # noqa: E402

from bench.durable_suite import enqueue, truncate  # noqa: E402

COUNTS: collections.Counter = collections.Counter()
SECONDS: collections.Counter = collections.Counter()
LOCK = threading.Lock()


def kind(sql: str) -> str:
    """The statement's first words and tables: enough to tell the statements apart."""
    text = " ".join(sql.split())[:4000]
    verb = text.split(" ", 1)[0].upper()
    tables = sorted(set(re.findall(r'"?(durable_[a-z_]+)"?', text)))
    return f"{verb} {','.join(tables)}"


def wrapper(execute, sql, params, many, context):
    started = time.perf_counter()
    try:
        return execute(sql, params, many, context)
    finally:
        with LOCK:
            COUNTS[kind(sql)] += 1
            SECONDS[kind(sql)] += time.perf_counter() - started


def on_connection(sender, connection, **kwargs):
    connection.execute_wrappers.append(wrapper)


def commits() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        return cursor.fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--workflow", default="bench_one_step")
    parser.add_argument("--concurrency", default="4")
    args = parser.parse_args()
    truncate()
    enqueue(args.workflow, args.n)
    before = commits()
    connection.close()
    connection_created.connect(on_connection)
    started = time.perf_counter()
    call_command("durable_worker", "--burst", "--concurrency", args.concurrency, verbosity=0)
    elapsed = time.perf_counter() - started
    connection_created.disconnect(on_connection)
    after = commits()
    total = sum(COUNTS.values())
    print(f"{args.n} runs in {elapsed:.1f}s ({args.n / elapsed:,.0f}/s)")
    print(
        f"statements per run: {total / args.n:.2f}; commits per run (server): "
        f"{(after - before) / args.n:.2f}"
    )
    for name, count in COUNTS.most_common():
        print(f"  {count / args.n:6.3f}/run  {SECONDS[name] / count * 1000:6.2f} ms  {name}")


if __name__ == "__main__":
    main()
