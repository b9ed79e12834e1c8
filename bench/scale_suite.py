"""The scale suite: do starts, claims and the dashboard's queries cost the same with
millions of runs in the table as with none?

    python -m bench.scale_suite --db bench_scale --out result.json [--sizes 0,1000000,5000000]

At each size (the table grown to it by ``bench/scale_fill.py``, then ``VACUUM
ANALYZE`` as autovacuum would have left it, and a ``CHECKPOINT``), the same
measurements:

- ``start_new_key``, ``start_duplicate``, ``start_handoff``: ``--n`` starts each, ops/s,
  and the statements one start sends;
- ``claim_execute``: ``--n`` one-step runs through a burst worker at concurrency 4, runs/s;
- the dashboard's queries, milliseconds (median of 7, warm cache): the Keys page
  (``describe_keys`` of the first 50 keys), ``list_keys()`` of a workflow with 200 keys,
  the runs list (first page, and filtered by status).

Its database is its own (``--db``), created and dropped here: never the tests'.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

import django_durable as durable  # noqa: E402
from bench import durable_suite  # noqa: E402
from bench.common import rate, stopwatch  # noqa: E402
from bench.scale_fill import fill  # noqa: E402
from bench.workflows import BenchKeyed, ScaleSmall  # noqa: E402
from django_durable import query  # noqa: E402
from django_durable.models import Run  # noqa: E402

SMALL_KEYS = 200
THROUGHPUT = ["start_new_key", "start_duplicate", "start_handoff", "claim_execute"]
PAGES = ["keys_page_ms", "list_keys_small_ms", "runs_page_ms", "runs_page_failed_ms"]


def grow(have: int, size: int, biggest: int) -> float:
    """Grow the filler from ``have`` to ``size`` runs; the seconds it took."""
    with stopwatch() as elapsed, connection.cursor() as cursor:
        cursor.execute("SET maintenance_work_mem = '256MB'")
        if size > have:
            fill(cursor, have, size - 1, biggest)
        cursor.execute("VACUUM ANALYZE durable_run")
        cursor.execute("VACUUM ANALYZE durable_activity")
        # The load's pages on disk before anything is measured: otherwise the next
        # minutes measure the checkpointer writing gigabytes back beside each commit.
        cursor.execute("CHECKPOINT")
    return elapsed()


def sizes_of_tables() -> dict:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), pg_total_relation_size('durable_run'), "
            "pg_indexes_size('durable_run') FROM durable_run"
        )
        rows, total, indexes = cursor.fetchone()
    return {"rows": rows, "table_bytes": total, "index_bytes": indexes}


def statements(fn) -> int:
    with CaptureQueriesContext(connection) as captured:
        fn()
    return len(captured.captured_queries)


def starts(n: int, tag: str) -> dict:
    keys = [f"{tag}:{i}" for i in range(n)]
    out: dict = {}
    with stopwatch() as elapsed:
        for i, key in enumerate(keys):
            durable.start(BenchKeyed, {"i": i}, key=key)
    out["start_new_key"] = rate(n, elapsed())
    with stopwatch() as elapsed:
        for i, key in enumerate(keys):
            durable.start(BenchKeyed, {"i": i}, key=key)
    out["start_duplicate"] = rate(n, elapsed())
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE durable_run SET status = 'completed', finished_at = now(), due_at = NULL "
            "WHERE workflow = %s AND key LIKE %s AND holds_key",
            [BenchKeyed.name, f"{tag}:%"],
        )
    with stopwatch() as elapsed:
        for i, key in enumerate(keys):
            result = durable.start_detailed(BenchKeyed, {"i": i}, key=key)
            if result.outcome != "handed_off":
                raise RuntimeError(f"expected a hand-off, got {result.outcome}")
    out["start_handoff"] = rate(n, elapsed())
    # What one start of each kind sends (the new holders are pending: a duplicate).
    out["statements"] = {
        "start_new_key": statements(lambda: durable.start(BenchKeyed, key=f"{tag}:extra")),
        "start_duplicate": statements(lambda: durable.start(BenchKeyed, key=f"{tag}:extra")),
    }
    Run.objects.filter(workflow=BenchKeyed.name, key=f"{tag}:extra").update(
        status="completed", due_at=None
    )
    out["statements"]["start_handoff"] = statements(
        lambda: durable.start(BenchKeyed, key=f"{tag}:extra")
    )
    # The new holders must not wait for the worker of claim_execute.
    Run.objects.filter(workflow=BenchKeyed.name, key__startswith=f"{tag}:").update(
        status="completed", due_at=None, finished_at=timezone.now()
    )
    return out


def timed_ms(fn, repeat: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def pages() -> dict:
    for j in range(SMALL_KEYS):
        durable.start(ScaleSmall, {"j": j}, key=f"s:{j}")
    small = query.list_keys(ScaleSmall.name)
    if len(small) != SMALL_KEYS:
        raise RuntimeError(f"list_keys found {len(small)} of {SMALL_KEYS} keys")
    Run.objects.filter(workflow=ScaleSmall.name).update(status="completed", due_at=None)
    return {
        "keys_page_ms": timed_ms(lambda: query.describe_keys(query.keys_queryset()[:51])),
        "list_keys_small_ms": timed_ms(lambda: query.list_keys(ScaleSmall.name)),
        "runs_page_ms": timed_ms(lambda: list(Run.objects.order_by("-created_at", "-id")[:51])),
        "runs_page_failed_ms": timed_ms(
            lambda: list(Run.objects.filter(status="failed").order_by("-created_at", "-id")[:51])
        ),
    }


def measure(size: int, n: int) -> dict:
    out = starts(n, f"m{size}")
    out["claim_execute"] = durable_suite.run_worker_burst("bench_one_step", n, 4)
    out.update(pages())
    for name in THROUGHPUT:
        print(f"  {size:>9,} runs  {name}: {out[name]:,.0f}/s", flush=True)
    for name in PAGES:
        print(f"  {size:>9,} runs  {name}: {out[name]:,.1f} ms", flush=True)
    return out


def run(sizes: list[int], n: int) -> dict:
    """Every size in increasing order; the figures and their ratio to the first size."""
    durable_suite.truncate()
    # A first pass that is not kept: this process and the server warm up alike for
    # every size (the first size would otherwise pay for it alone).
    starts(min(n, 500), "warm")
    durable_suite.truncate()
    sizes = sorted(sizes)
    have, rows = 0, []
    for size in sizes:
        loaded = grow(have, size, sizes[-1])
        have = max(have, size)
        tables = sizes_of_tables()
        print(f"== {size:,} existing runs (loaded in {loaded:.0f}s): {tables}", flush=True)
        rows.append({"size": size, "load_seconds": round(loaded, 1), **tables, **measure(size, n)})
    base = rows[0]
    for row in rows:
        row["ratio"] = {
            name: round(row[name] / base[name], 3) for name in THROUGHPUT + PAGES if base[name]
        }
        for name in THROUGHPUT:
            row[name] = round(row[name], 1)
        for name in PAGES:
            row[name] = round(row[name], 2)
    return {"n": n, "sizes": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--sizes", default="0,1000000,5000000")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = run([int(s) for s in args.sizes.split(",")], args.n)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
