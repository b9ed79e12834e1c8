"""What rerun's record costs a long run: bytes written by one 30-step run whose every
step replaces a 20 kB value in the context, in two checkouts side by side.

Each checkout runs, on a database of its own (autovacuum off on the store's tables, so
no space is reused while it runs), ``--runs`` such runs one after the other, each
started and then executed in the same process (``testing.drain``, the executor's path
of every worker: one record per step). For each run it reports:

- ``table_bytes``: how much the store's tables grew (``pg_total_relation_size`` of
  ``durable_run`` and ``durable_step_attempt``: heap, TOAST and indexes). Every record
  writes new row versions; nothing is reclaimed while it runs, so the growth is what
  the run wrote to its tables. Per database: other sessions of the server do not count.
- ``wal_bytes``: the WAL the server wrote meanwhile (``pg_current_wal_lsn()``
  difference): everything the run wrote, but server-wide, so another session's writes
  count too (the minimum over the runs is the least disturbed);
- ``state_bytes``: the run's ``state`` at its end.

Run: ``python bench/replay_record.py BASE_CHECKOUT [--runs 5]`` from this checkout
(``git archive main | tar -x -C /tmp/base`` makes BASE_CHECKOUT).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
STEPS = 30
VALUE_BYTES = 20_000
METRICS = ("table_bytes", "wal_bytes", "state_bytes")
TABLES = ("durable_run", "durable_step_attempt")


def one(runs: int) -> list[dict]:
    """The runs in this process's checkout (``--one``)."""
    import django

    django.setup()
    from django.db import connection

    import django_durable as durable
    from django_durable import Workflow, step
    from django_durable.models import Run
    from django_durable.testing import drain

    def replacing(index: int):
        def method(self, ctx):
            # Random text: what pglz cannot shrink, as most real values.
            ctx.put("blob", secrets.token_urlsafe(VALUE_BYTES * 3 // 4))

        method.__name__ = method.__qualname__ = f"s{index:02d}"
        return step(method)

    namespace = {f"s{i:02d}": replacing(i) for i in range(STEPS)}
    workflow = type("BenchThirtySteps", (Workflow,), {"name": "bench_thirty_steps", **namespace})

    def measure() -> tuple[int, int]:
        with connection.cursor() as cursor:
            sizes = " + ".join(f"pg_total_relation_size('{table}')" for table in TABLES)
            cursor.execute(f"SELECT {sizes}, pg_current_wal_lsn() - '0/0'::pg_lsn")
            tables, wal = cursor.fetchone()
        return int(tables), int(wal)

    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    results = []
    for _ in range(runs):
        tables, wal = measure()
        run_id = durable.start(workflow)
        drain(max_seconds=300)
        after_tables, after_wal = measure()
        run = Run.objects.get(id=run_id)
        assert run.status == "completed", run.status
        results.append(
            {
                "table_bytes": after_tables - tables,
                "wal_bytes": after_wal - wal,
                "state_bytes": len(json.dumps(run.state)),
            }
        )
    return results


def _env(tree: str, database: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": tree,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "BENCH_DB_NAME": database,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("base", nargs="?")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--one", action="store_true")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.runs)))
        return
    from bench.common import recreate_database

    trees = {"base": str(Path(args.base).resolve()), "this": str(HERE)}
    for name, tree in trees.items():
        database = f"bench_replay_record_{name}"
        recreate_database(database)
        env = _env(tree, database)
        manage = [sys.executable, f"{tree}/manage.py", "migrate", "-v", "0"]
        subprocess.run(manage, cwd=tree, env=env, check=True, timeout=600)
        command = [sys.executable, str(HERE / "bench" / "replay_record.py"), "--one"]
        done = subprocess.run(
            [*command, "--runs", str(args.runs)],
            cwd=tree,
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        results = json.loads(done.stdout.strip().splitlines()[-1])
        print(name, results, flush=True)
        for metric in METRICS:
            values = [r[metric] for r in results]
            print(
                f"  {metric}: median {statistics.median(values):,.0f}, min {min(values):,}",
                flush=True,
            )


if __name__ == "__main__":
    main()
