"""How fast are the key queries on a big runs table?

Builds a throwaway PostgreSQL database with ``--rows`` runs (a million by
default) and ``--activity`` re-adds, then times ``list_keys``, the Keys page,
``stats.keys`` and the Key view's queries. The numbers are for humans: no test
asserts wall time.

    python bench/keys_table.py [--rows 1000000] [--activity 300000] [--explain] [--keep]

PostgreSQL comes from PGHOST/PGPORT/PGUSER (default 127.0.0.1:5432, postgres).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DB_NAME = os.environ.get("BENCH_DB_NAME", "durable_bench_keys")


def setup_django() -> None:
    os.environ["DURABLE_TEST_DB"] = "postgres"
    os.environ["PGDATABASE"] = DB_NAME
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()


def create_database() -> None:
    import psycopg

    params = {
        "host": os.environ.get("PGHOST", "127.0.0.1"),
        "port": os.environ.get("PGPORT", "5432"),
        "user": os.environ.get("PGUSER", "postgres"),
        "dbname": "postgres",
        "autocommit": True,
    }
    with psycopg.connect(**params) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}"')
        conn.execute(f'CREATE DATABASE "{DB_NAME}"')


def drop_database() -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    with psycopg.connect(
        host=os.environ.get("PGHOST", "127.0.0.1"),
        port=os.environ.get("PGPORT", "5432"),
        user=os.environ.get("PGUSER", "postgres"),
        dbname="postgres",
        autocommit=True,
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}"')


def fill(rows: int, activity: int) -> None:
    from tests.keys_table_sql import fill_keys_table

    started = time.perf_counter()
    fill_keys_table(rows, activity, vacuum=True)
    print(f"filled {rows} runs and {activity} re-adds in {time.perf_counter() - started:.1f}s")


def timed(label: str, fn, repeat: int = 5) -> None:
    fn()  # warm the cache: the numbers are for a live database, not a cold disk
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    print(f"{label:<52} median {statistics.median(times):8.1f} ms   min {min(times):8.1f} ms")


def explain(label: str, queryset) -> None:
    print(f"\n--- EXPLAIN ANALYZE {label}")
    print(queryset.explain(analyze=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--activity", type=int, default=300_000)
    parser.add_argument("--explain", action="store_true", help="print the query plans")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()

    setup_django()
    from django.core.management import call_command
    from django.core.paginator import Paginator

    from django_durable import query, stats
    from django_durable.models import Run
    from django_durable.operations.runs import list_executions

    create_database()
    try:
        call_command("migrate", verbosity=0)
        fill(args.rows, args.activity)
        keyed = Run.objects.filter(key__isnull=False).count()
        print(
            f"{args.rows} runs, {keyed} with a key, "
            f"{Run.objects.filter(holds_key=True).count()} holders\n"
        )

        busiest = stats.keys()["top_readded_keys"][0]
        page = query.keys_queryset()
        timed("Keys page: first 50 keys", lambda: query.describe_keys(page[:50]))
        timed(
            "Keys page: 50 keys from the middle (offset 100000)",
            lambda: query.describe_keys(page[100_000:100_050]),
        )
        timed("Keys page: count of keys (paginator)", lambda: Paginator(page, 50).count)
        timed(
            "Keys page: workflow_1, first 50",
            lambda: query.describe_keys(query.keys_queryset("workflow_1")[:50]),
        )
        timed(
            "Keys page: holder status failed, first 50",
            lambda: query.describe_keys(query.keys_queryset(holder_status="failed")[:50]),
        )
        timed(
            "Keys page: search 'item:4242'",
            lambda: query.describe_keys(query.keys_queryset(search="item:4242")[:50]),
        )
        timed(
            "list_keys('workflow_1') (every key of a workflow)",
            lambda: query.list_keys("workflow_1"),
            repeat=3,
        )
        timed("list_keys() (every key)", lambda: query.list_keys(), repeat=3)
        timed("stats.keys()", lambda: stats.keys())
        timed("stats.keys('workflow_1')", lambda: stats.keys("workflow_1"))
        timed(
            "list_executions(key=...) (Key view)",
            lambda: list(list_executions(key=busiest["key"], workflow=busiest["workflow"])),
        )
        timed(
            "re-adds of one key (Key view)",
            lambda: list(query.readds(busiest["workflow"], busiest["key"])[:100]),
        )
        if args.explain:
            explain("Keys page, first 50", page[:50])
            explain(
                "Keys page, holder status failed", query.keys_queryset(holder_status="failed")[:50]
            )
            explain("list_executions(key=...)", list_executions(key=busiest["key"]))
            explain("keys held", Run.objects.filter(holds_key=True).order_by().values("id")[:1])
            explain(
                "holders of a page of keys",
                Run.objects.filter(
                    holds_key=True,
                    workflow__in=["workflow_1"],
                    key__in=[r["key"] for r in page[:50]],
                ).order_by(),
            )
    finally:
        if not args.keep:
            drop_database()


if __name__ == "__main__":
    main()
