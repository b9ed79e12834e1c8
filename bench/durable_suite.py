"""django-durable itself: starts in the caller's process, and the worker as a separate
``manage.py durable_worker`` process, as a project runs it.

Run by ``bench/run.py`` with ``DJANGO_SETTINGS_MODULE=bench.settings`` and the
database already migrated.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection, connections  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

import django_durable as durable  # noqa: E402
from bench.common import Results, percentile, rate, stopwatch, suite_args, wanted  # noqa: E402
from bench.workflows import FLOW_KEYS, BenchKeyed  # noqa: E402
from django_durable.models import Run, StepAttempt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORKER_METRICS = [
    "worker_c1",
    "worker_c4",
    "worker1_c4",
    "worker_c4_logged",
    "worker_c4_backlog",
    "worker_c4_flow",
]
LATENCY_METRICS = ["latency_p50_ms", "latency_p99_ms"]
BACKLOG = 50_000


def truncate() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE durable_run, durable_step_attempt, durable_activity, durable_event CASCADE"
        )


# --- starts ---------------------------------------------------------------------


def starts(results: Results, args, n: int, tag: str) -> None:
    keys = [f"{tag}:{i}" for i in range(n)]
    if wanted(args, "start_new_key", "start_duplicate", "start_duplicate_error", "start_handoff"):
        with stopwatch() as elapsed:
            for i, key in enumerate(keys):
                durable.start(BenchKeyed, {"i": i}, key=key)
        results.add("start_new_key", rate(n, elapsed()), "ops/s")
    if wanted(args, "start_duplicate"):
        with stopwatch() as elapsed:
            for i, key in enumerate(keys):
                durable.start(BenchKeyed, {"i": i}, key=key)
        results.add("start_duplicate", rate(n, elapsed()), "ops/s")
    if wanted(args, "start_duplicate_error"):
        with stopwatch() as elapsed:
            for i, key in enumerate(keys):
                try:
                    durable.start(BenchKeyed, {"i": i}, key=key, on_duplicate="error")
                except durable.KeyTaken:
                    pass
                else:
                    raise RuntimeError("a duplicate start did not raise KeyTaken")
        results.add("start_duplicate_error", rate(n, elapsed()), "ops/s")
    if wanted(args, "start_handoff"):
        # Every holder finishes (as a worker would record it); the next start takes the key.
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE durable_run SET status = 'completed', finished_at = now(), due_at = NULL "
                "WHERE workflow = %s",
                [BenchKeyed.name],
            )
        with stopwatch() as elapsed:
            for i, key in enumerate(keys):
                result = durable.start_detailed(BenchKeyed, {"i": i}, key=key)
                if result.outcome != "handed_off":
                    raise RuntimeError(f"expected a hand-off, got {result.outcome}")
        results.add("start_handoff", rate(n, elapsed()), "ops/s")


def start_statement(results: Results, n: int, tag: str) -> None:
    """``start_statement``: the one statement of a new key's start (``SELECT
    durable_start(...)``), as a start sends it through Django's cursor, with its
    parameters built beforehand: what a start costs without any of its Python, so
    the most a start could reach with Django's default (client-side) binding."""
    sent = []

    def capture(execute, sql, params, many, context):
        sent.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        durable.start(BenchKeyed, {"i": -1}, key=f"{tag}:statement")
    [(sql, params)] = [(sql, params) for sql, params in sent if "durable_start_v2(" in sql]
    calls = [
        {**params, "id": str(uuid.uuid4()), "key": f"{tag}:statement:{i}", "input": f'{{"i": {i}}}'}
        for i in range(n)
    ]
    with stopwatch() as elapsed:
        for call in calls:
            with connection.cursor() as cursor:
                cursor.execute(sql, call)
                if cursor.fetchone()[0] != "true":
                    raise RuntimeError("the statement did not insert its run")
    results.add("start_statement", rate(n, elapsed()), "ops/s")


def start_prepared(results: Results, n: int, tag: str) -> None:
    """``start_new_key_prepared``: ``start_new_key`` through the ``prepared`` alias,
    Django's ``server_side_binding`` with psycopg's ``prepare_threshold`` (the
    documented opt-in; off by default)."""
    with override_settings(DURABLE={**settings.DURABLE, "DATABASE": "prepared"}):
        try:
            with stopwatch() as elapsed:
                for i in range(n):
                    durable.start(BenchKeyed, {"i": i}, key=f"{tag}:prepared:{i}")
        finally:
            connections["prepared"].close()
    results.add("start_new_key_prepared", rate(n, elapsed()), "ops/s")


# --- the worker -----------------------------------------------------------------


def worker_available() -> bool:
    return (ROOT / "django_durable/management/commands/durable_worker.py").exists()


def worker_command(*extra: str, verbosity: int = 0) -> list[str]:
    """The worker as a project runs it. ``-v 0`` (warnings only) by default, as the peers'
    workers run here: none of them logs per job unless logging is configured."""
    return [
        sys.executable,
        str(ROOT / "manage.py"),
        "durable_worker",
        "-v",
        str(verbosity),
        *extra,
    ]


def enqueue(workflow: str, n: int, queue: str = "default", flow_keys: int = 0) -> None:
    """Insert ``n`` due runs at once (the setup, not what is measured); with
    ``flow_keys``, run ``i``'s flow key is ``tenant:<i mod flow_keys>``."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO durable_run (id, workflow, queue, status, input, context, holds_key,
                step_index, attempt, due_at, state, fence, created_at, flow_key)
            SELECT gen_random_uuid(), %s, %s, 'pending', jsonb_build_object('i', g), '{}',
                false, 0, 1, now(), '{}', 0, now(),
                CASE WHEN %s > 0 THEN 'tenant:' || (g %% %s) END
            FROM generate_series(1, %s) AS g
            """,
            [workflow, queue, flow_keys, max(flow_keys, 1), n],
        )
        cursor.execute("ANALYZE durable_run")


def run_worker_burst(
    workflow: str,
    n: int,
    concurrency: int,
    queues: str | None = None,
    verbosity: int = 0,
    flow_keys: int = 0,
) -> float:
    """Run ``n`` runs of ``workflow`` through one burst worker; runs/s from the first
    claim to the last completion, both read from the database."""
    enqueue(workflow, n, flow_keys=flow_keys)
    command = worker_command("--concurrency", str(concurrency), "--burst", verbosity=verbosity)
    if queues:
        command += ["--queues", queues]
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=os.environ, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"durable_worker exited {done.returncode}: {done.stderr[-500:]}")
    runs = Run.objects.filter(workflow=workflow)
    completed = runs.filter(status="completed").count()
    if completed != n:
        raise RuntimeError(
            f"{completed} of {n} {workflow} runs completed in {time.monotonic() - started:.0f}s"
        )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(started_at)) FROM durable_run "
            "WHERE workflow = %s",
            [workflow],
        )
        seconds = float(cursor.fetchone()[0])
    runs.delete()
    return rate(n, seconds)


def workers(results: Results, args, n: int) -> None:
    if not worker_available():
        results.miss(WORKER_METRICS, "manage.py durable_worker is not in this checkout")
        return
    for name, workflow, concurrency in (
        ("worker_c1", "bench_two_steps", 1),
        ("worker_c4", "bench_two_steps", 4),
        ("worker1_c4", "bench_one_step", 4),
    ):
        if wanted(args, name):
            results.measure(
                [name],
                lambda name=name, workflow=workflow, concurrency=concurrency: results.add(
                    name, run_worker_burst(workflow, n, concurrency), "runs/s"
                ),
            )
    if wanted(args, "worker_c4_logged"):
        # The same as worker_c4 at the command's default verbosity: two INFO lines per run.
        results.measure(
            ["worker_c4_logged"],
            lambda: results.add(
                "worker_c4_logged",
                run_worker_burst("bench_two_steps", n, 4, verbosity=1),
                "runs/s",
            ),
        )
    if wanted(args, "worker_c4_flow"):
        # worker_c4 with flow control: the same two steps, each run with one of 20
        # flow keys and a per-key limit never reached (BenchFlowed), so every claim
        # takes the flow path and counts each key it takes.
        results.measure(
            ["worker_c4_flow"],
            lambda: results.add(
                "worker_c4_flow",
                run_worker_burst("bench_flowed", n, 4, flow_keys=FLOW_KEYS),
                "runs/s",
            ),
        )
    if wanted(args, "worker_c4_backlog"):
        enqueue("bench_backlog", BACKLOG, queue="backlog")
        try:
            results.measure(
                ["worker_c4_backlog"],
                lambda: results.add(
                    "worker_c4_backlog",
                    run_worker_burst("bench_two_steps", n, 4, queues="default"),
                    "runs/s",
                ),
            )
        finally:
            Run.objects.filter(workflow="bench_backlog").delete()


def latency(results: Results, args, count: int, per_second: float = 50.0) -> None:
    """Start-to-first-step latency at ``per_second`` starts with an idle worker."""
    if not wanted(args, *LATENCY_METRICS):
        return
    if not worker_available():
        results.miss(LATENCY_METRICS, "manage.py durable_worker is not in this checkout")
        return
    # The worker's log goes to a file: a pipe nobody reads would fill and block it.
    with tempfile.TemporaryFile(mode="w+") as log:
        waits = _latencies(count, per_second, log)
    results.add("latency_p50_ms", percentile(waits, 50), "ms")
    results.add("latency_p99_ms", percentile(waits, 99), "ms")


def _latencies(count: int, per_second: float, log) -> list[float]:
    worker = subprocess.Popen(
        worker_command("--concurrency", "1"),
        cwd=ROOT,
        env=os.environ,
        stdout=subprocess.DEVNULL,
        stderr=log,
        text=True,
    )
    try:
        # One run first: the worker is up and idle once it has finished it.
        warm = durable.start("bench_one_step")
        deadline = time.monotonic() + 30
        while Run.objects.filter(id=warm, status="completed").count() == 0:
            if worker.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"the worker did not start: {log.read()[-500:]}")
            time.sleep(0.05)
        time.sleep(0.5)
        ids = []
        begin = time.monotonic()
        for i in range(count):
            pause = begin + i / per_second - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            ids.append(durable.start("bench_one_step", {"i": i}))
        deadline = time.monotonic() + 30
        while StepAttempt.objects.filter(run_id__in=ids, step_index=0).count() < count:
            if time.monotonic() > deadline:
                raise RuntimeError("the worker did not pick up every run within 30s")
            time.sleep(0.1)
        # Both clocks are this machine's: the run's created_at is set by start(),
        # the attempt's started_at by the worker as the step begins.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT EXTRACT(EPOCH FROM min(a.started_at) - r.created_at) * 1000 "
                "FROM durable_run r JOIN durable_step_attempt a ON a.run_id = r.id "
                "WHERE r.id = ANY(%s) GROUP BY r.id, r.created_at",
                [ids],
            )
            waits = [float(row[0]) for row in cursor.fetchall()]
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    return waits


def main() -> None:
    args = suite_args(__doc__)
    results = Results()
    for repeat in range(args.repeats):
        print(f"django-durable, repeat {repeat + 1}", flush=True)
        truncate()
        results.measure(
            ["start_new_key", "start_duplicate", "start_duplicate_error", "start_handoff"],
            lambda repeat=repeat: starts(results, args, args.n, f"r{repeat}"),
        )
        if wanted(args, "start_statement"):
            truncate()
            results.measure(
                ["start_statement"],
                lambda repeat=repeat: start_statement(results, args.n, f"r{repeat}"),
            )
        if wanted(args, "start_new_key_prepared"):
            truncate()
            results.measure(
                ["start_new_key_prepared"],
                lambda repeat=repeat: start_prepared(results, args.n, f"r{repeat}"),
            )
        truncate()
        workers(results, args, args.n)
        truncate()
        results.measure(LATENCY_METRICS, lambda: latency(results, args, 100 if args.quick else 500))
    results.write(args.out)


if __name__ == "__main__":
    main()
