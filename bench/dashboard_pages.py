"""How fast is each dashboard page on a runs table of a million runs?

Builds a throwaway PostgreSQL database with ``--rows`` runs (5% of them active:
pending, running, waiting for an input or an event), then asks every dashboard
page (and the admin's Run list) through Django's test client, signed in as a
superuser, and prints the median server time of each. The target is 100 ms per
page; nothing asserts it (tests pin the number of queries instead).

Next to the wall time it prints how much of it was SQL (the time spent inside
the cursor's ``execute``, the database's answer included) and the CPU time of
this Python process: on a busy machine the wall time grows with the load, and
these two say where a slow page spends its time.

    python bench/dashboard_pages.py [--rows 1000000] [--repeat 5] [--keep] [--reuse]

``--keep`` leaves the database behind; ``--reuse`` times the pages again on it
without filling a new one.

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

DB_NAME = os.environ.get("BENCH_DB_NAME", "durable_bench_dashboard")
TARGET_MS = 100

# 1M runs over the defined workflows: 95% finished (2% of all failed, with an
# error), 5% active: 2% pending (half of them due), 1% running on a worker,
# 2% waiting (for input "approval" or event "paid"). A key on four runs in five.
RUNS_SQL = """
INSERT INTO durable_run (id, workflow, queue, status, input, context, state, key, holds_key,
                         step_index, attempt, fence, created_at, started_at, finished_at,
                         due_at, waiting_for, worker_id, lease_expires_at, error)
SELECT gen_random_uuid(), w.name, 'default', s.status,
       jsonb_build_object('id', i, 'note', repeat('x', 40)), '{}'::jsonb, '{}'::jsonb,
       CASE WHEN i %% 5 = 0 THEN NULL ELSE 'item:' || i END,
       i %% 5 <> 0,
       0, 1, 1,
       now() - make_interval(secs => (%(rows)s - i) * 0.5),
       now() - make_interval(secs => (%(rows)s - i) * 0.5),
       CASE WHEN s.status IN ('completed', 'failed')
            THEN now() - make_interval(secs => (%(rows)s - i) * 0.5) END,
       CASE WHEN s.status = 'pending' THEN now() + make_interval(secs => (i %% 2) * 3600 - 60) END,
       CASE WHEN s.status = 'waiting'
            THEN (ARRAY['input:approval', 'event:paid'])[1 + i %% 2] END,
       CASE WHEN s.status IN ('running', 'completed', 'failed')
            THEN 'bench-worker-' || (i %% 4) END,
       CASE WHEN s.status = 'running' THEN now() + interval '30 seconds' END,
       CASE WHEN s.status = 'failed'
            THEN jsonb_build_object('type', 'RuntimeError', 'message', 'failed ' || i) END
FROM generate_series(0, %(rows)s - 1) AS i
CROSS JOIN LATERAL (SELECT (%(names)s::text[])[1 + i %% %(count)s] AS name) AS w
CROSS JOIN LATERAL (SELECT CASE WHEN i %% 100 < 2 THEN 'pending'
                                WHEN i %% 100 < 3 THEN 'running'
                                WHEN i %% 100 < 5 THEN 'waiting'
                                WHEN i %% 100 < 7 THEN 'failed'
                                ELSE 'completed' END AS status) AS s
"""


def setup_django() -> None:
    os.environ["DURABLE_TEST_DB"] = "postgres"
    os.environ["PGDATABASE"] = DB_NAME
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.test.utils import setup_test_environment

    setup_test_environment()  # the test client's host, no e-mail sent


def admin_database(sql: str) -> None:
    import psycopg

    with psycopg.connect(
        host=os.environ.get("PGHOST", "127.0.0.1"),
        port=os.environ.get("PGPORT", "5432"),
        user=os.environ.get("PGUSER", "postgres"),
        dbname="postgres",
        autocommit=True,
    ) as conn:
        conn.execute(sql)


def fill(rows: int) -> list[str]:
    from django.db import connection

    from django_durable.workflows.definition import registry

    names = sorted(w.name for w in registry.all())
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(RUNS_SQL, {"rows": rows, "names": names, "count": len(names)})
        cursor.execute("VACUUM ANALYZE durable_run")
    print(f"filled {rows} runs over {len(names)} workflows in {time.perf_counter() - started:.0f}s")
    return names


class SqlClock:
    """Sums the wall time of every statement (``connection.execute_wrapper``)."""

    def __init__(self):
        self.seconds = 0.0
        self.statements = 0

    def __call__(self, execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.seconds += time.perf_counter() - started
            self.statements += 1


def timed(client, label: str, path: str, repeat: int, follow=False, **params) -> float:
    """The page's median time; ``follow``: with the redirect it answers with
    (a search longer than 1,000 characters comes back cut), both requests timed."""
    from django.db import connection

    # Warm: the numbers are for a live database, not a cold disk.
    client.get(path, params, follow=follow)
    walls, sqls, cpus, statements = [], [], [], 0
    for _ in range(repeat):
        clock = SqlClock()
        with connection.execute_wrapper(clock):
            cpu = time.process_time()
            started = time.perf_counter()
            response = client.get(path, params, follow=follow)
            walls.append((time.perf_counter() - started) * 1000)
            cpus.append((time.process_time() - cpu) * 1000)
        sqls.append(clock.seconds * 1000)
        statements = clock.statements
        assert response.status_code == 200, (label, response.status_code)
    median = statistics.median(walls)
    mark = "ok" if median <= TARGET_MS else "OVER"
    print(
        f"| {label:<52} | {median:8.1f} | {min(walls):8.1f} | {statistics.median(sqls):8.1f} "
        f"| {statistics.median(cpus):8.1f} | {statements:5} | {mark:<4} |"
    )
    return median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--reuse", action="store_true", help="time a kept database again")
    args = parser.parse_args()

    if not args.reuse:
        admin_database(f'DROP DATABASE IF EXISTS "{DB_NAME}"')
        admin_database(f'CREATE DATABASE "{DB_NAME}"')
    setup_django()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connections
    from django.test import Client
    from django.urls import reverse
    from django.utils import timezone

    import django_durable as durable
    from django_durable.models import Run, WorkerNode
    from django_durable.testing import drain
    from django_durable.workflows.definition import registry
    from tests.dashboard_workflows import DashOrder
    from tests.testapp.workflows import SyncAccount

    try:
        if args.reuse:
            order = Run.objects.get(workflow=DashOrder.name, key="order:1").id
            names = sorted(w.name for w in registry.all())
            args.rows = Run.objects.order_by()[: 10**8].count()
            args.keep = True
        else:
            call_command("migrate", verbosity=0)
            # The run with a timeline and a flow graph, before the table fills up
            # (drain() would run the generated due runs too).
            order = durable.start(DashOrder, {"order": 1, "fail_ship": True}, key="order:1")
            drain()
            durable.provide_input(order, "approval", True)
            drain()
            names = fill(args.rows)
            durable.schedule(SyncAccount, "0 3 * * *", key="nightly-sync", name="nightly")
            get_user_model().objects.create_superuser("bench", "b@example.com", "pw")
        # The workers that finished the runs, live: the workers page counts their
        # runs of the last 24 hours (reuse: their heartbeat made fresh again).
        for n in range(4):
            WorkerNode.objects.update_or_create(
                id=f"bench-worker-{n}",
                defaults={"hostname": "bench", "pid": n, "heartbeat_at": timezone.now()},
            )
        failed = Run.objects.filter(status="failed").only("id").first()
        user = get_user_model().objects.get(username="bench")
        client = Client()
        client.force_login(user)
        words = " ".join(f"w{n}" for n in range(10_000))

        def page(name, *a):
            return reverse(f"django_durable:{name}", args=a)

        print(f"\n{args.rows} runs, 5% active; median of {args.repeat}, server time in ms")
        print(f"load average: {' '.join(f'{n:.2f}' for n in os.getloadavg())}\n")
        print(
            f"| {'page':<52} | {'median':>8} | {'min':>8} | {'sql':>8} | {'cpu':>8} "
            f"| {'stmts':>5} | {'≤100':<4} |"
        )
        print(f"|{'-' * 54}|{'-' * 10}|{'-' * 10}|{'-' * 10}|{'-' * 10}|{'-' * 7}|{'-' * 6}|")
        r = args.repeat
        timed(client, "overview", page("overview"), r)
        timed(client, "keys", page("keys"), r)
        timed(client, "keys, workflow filter", page("keys"), r, workflow=names[0])
        timed(client, "runs", page("runs"), r)
        timed(client, "runs, page 200 (the last)", page("runs"), r, page=200)
        timed(client, "runs ?page=9223372036854775807", page("runs"), r, page=2**63 - 1)
        timed(client, "runs, q=key:item:4242", page("runs"), r, q="key:item:4242")
        timed(client, "runs, q=status:failed", page("runs"), r, q="status:failed")
        timed(
            client,
            f"runs, q=workflow:{names[0]} status:waiting",
            page("runs"),
            r,
            q=f"workflow:{names[0]} status:waiting",
        )
        timed(client, "runs, q=one free-text word (item:42424)", page("runs"), r, q="item:42424")
        timed(client, "runs, q=10,000 words (cut, 8 searched)", page("runs"), r, True, q=words)
        timed(
            client,
            "runs, created_after=today",
            page("runs"),
            r,
            created_after=time.strftime("%Y-%m-%d"),
        )
        timed(client, "run (a 1M-table run, failed)", page("run", failed.id), r)
        timed(client, "run (timeline + flow graph + child)", page("run", order), r)
        timed(client, f"workflow {names[0]}", page("workflow", names[0]), r)
        timed(client, "pending inputs", page("inputs"), r)
        timed(client, "schedules", page("schedules"), r)
        timed(client, "workers", page("workers"), r)
        timed(client, "queues", page("queues"), r)
        changelist = reverse("admin:django_durable_run_changelist")
        timed(client, "admin Run list", changelist, r)
        timed(client, "admin Run list, q=10,000 words (cut)", changelist, r, True, q=words)
        timed(client, "admin Run list, status filter", changelist, r, status__exact="failed")
    finally:
        connections.close_all()
        if not args.keep:
            admin_database(f'DROP DATABASE IF EXISTS "{DB_NAME}"')


if __name__ == "__main__":
    main()
