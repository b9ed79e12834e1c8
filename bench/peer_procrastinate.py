"""procrastinate, measured the way its docs use it: sync ``defer`` from web code
(``queueing_lock`` as the key), an async worker with ``concurrency=4``.

- ``procrastinate_defer_lock``: defer with a new ``queueing_lock``, ops/s
- ``procrastinate_duplicate``: defer with a lock already queued (raises ``AlreadyEnqueued``)
- ``procrastinate_batch_defer``: one ``batch_defer`` of N jobs, ops/s. Without locks:
  a batch shares one configuration, so it cannot give each job its own
  ``queueing_lock``
- ``procrastinate_worker_c4``: one-step no-op jobs, concurrency 4, jobs/s from the first
  ``started`` event to the last ``succeeded`` one (database timestamps)
- ``procrastinate_latency_p50_ms``: defer to ``started`` at 50 defers/s, idle worker
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import procrastinate

from bench.common import (
    Results,
    connect,
    dsn,
    percentile,
    rate,
    recreate_database,
    stopwatch,
    suite_args,
    wanted,
)


def make_app(db: str) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn(db)))

    @app.task(name="noop", queue="default")
    async def noop(i: int = 0) -> None:
        return None

    return app


def defers(results: Results, args, app, tag: str) -> None:
    noop = app.tasks["noop"]
    locks = [f"{tag}:{i}" for i in range(args.n)]
    with stopwatch() as elapsed:
        for i, lock in enumerate(locks):
            noop.configure(queueing_lock=lock).defer(i=i)
    results.add("procrastinate_defer_lock", rate(args.n, elapsed()), "ops/s")
    if wanted(args, "procrastinate_duplicate"):
        with stopwatch() as elapsed:
            for i, lock in enumerate(locks):
                try:
                    noop.configure(queueing_lock=lock).defer(i=i)
                except procrastinate.exceptions.AlreadyEnqueued:
                    pass
                else:
                    raise RuntimeError("a duplicate defer was accepted")
        results.add("procrastinate_duplicate", rate(args.n, elapsed()), "ops/s")
    if wanted(args, "procrastinate_batch_defer"):
        with stopwatch() as elapsed:
            ids = noop.batch_defer(*({"i": i} for i in range(args.n)))
        if len(ids) != args.n:
            raise RuntimeError(f"{len(ids)} of {args.n} batch jobs deferred")
        results.add("procrastinate_batch_defer", rate(args.n, elapsed()), "ops/s")


def truncate(db: str) -> None:
    with connect(db) as conn:
        conn.execute("TRUNCATE procrastinate_jobs, procrastinate_events CASCADE")


def worker_c4(db: str, app, n: int) -> float:
    truncate(db)
    app.tasks["noop"].batch_defer(*({"i": i} for i in range(n)))
    worker = make_app(db)

    async def run() -> None:
        async with worker.open_async():
            await worker.run_worker_async(concurrency=4, wait=False, install_signal_handlers=False)

    asyncio.run(run())
    with connect(db) as conn:
        done, seconds = conn.execute(
            "SELECT count(*) FILTER (WHERE type = 'succeeded'), EXTRACT(EPOCH FROM "
            "max(at) FILTER (WHERE type = 'succeeded') - min(at) FILTER (WHERE type = 'started')) "
            "FROM procrastinate_events"
        ).fetchone()
    if done != n:
        raise RuntimeError(f"{done} of {n} jobs succeeded")
    return rate(n, float(seconds))


def serve(db: str) -> None:
    """The idle worker of the latency test, in its own process like ours."""
    app = make_app(db)

    async def main() -> None:
        async with app.open_async():
            await app.run_worker_async(concurrency=1, wait=True)

    asyncio.run(main())


def latency(db: str, app, count: int, per_second: float = 50.0) -> float:
    truncate(db)
    worker = subprocess.Popen(
        [sys.executable, "-m", "bench.peer_procrastinate", "--serve", db], env=os.environ
    )
    try:
        noop = app.tasks["noop"]
        # One job first: the worker is up and idle once it has run it.
        noop.defer(i=-1)
        deadline = time.monotonic() + 30
        with connect(db) as conn:
            while not conn.execute(
                "SELECT count(*) FROM procrastinate_events WHERE type = 'succeeded'"
            ).fetchone()[0]:
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the procrastinate worker did not start")
                time.sleep(0.05)
            conn.execute("TRUNCATE procrastinate_jobs, procrastinate_events CASCADE")
        time.sleep(0.5)
        begin = time.monotonic()
        for i in range(count):
            pause = begin + i / per_second - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            noop.defer(i=i)
        deadline = time.monotonic() + 30
        with connect(db) as conn:
            while True:
                started = conn.execute(
                    "SELECT count(*) FROM procrastinate_events WHERE type = 'started'"
                ).fetchone()[0]
                if started >= count or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            rows = conn.execute(
                "SELECT EXTRACT(EPOCH FROM s.at - d.at) * 1000 FROM procrastinate_events d "
                "JOIN procrastinate_events s ON s.job_id = d.job_id AND s.type = 'started' "
                "WHERE d.type = 'deferred'"
            ).fetchall()
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    if len(rows) < count:
        raise RuntimeError(f"only {len(rows)} of {count} jobs started")
    return percentile([float(r[0]) for r in rows], 50)


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
        return
    args = suite_args(__doc__)
    results = Results()
    recreate_database(args.db)
    app = make_app(args.db)
    with app.open():
        app.schema_manager.apply_schema()
        for repeat in range(args.repeats):
            print(f"procrastinate, repeat {repeat + 1}", flush=True)
            truncate(args.db)
            defer_metrics = [
                "procrastinate_defer_lock",
                "procrastinate_duplicate",
                "procrastinate_batch_defer",
            ]
            if wanted(args, *defer_metrics):
                results.measure(
                    defer_metrics,
                    lambda repeat=repeat: defers(results, args, app, f"r{repeat}"),
                )
            if wanted(args, "procrastinate_worker_c4"):
                results.measure(
                    ["procrastinate_worker_c4"],
                    lambda: results.add(
                        "procrastinate_worker_c4", worker_c4(args.db, app, args.n), "jobs/s"
                    ),
                )
            if wanted(args, "procrastinate_latency_p50_ms"):
                count = 100 if args.quick else 500
                results.measure(
                    ["procrastinate_latency_p50_ms"],
                    lambda count=count: results.add(
                        "procrastinate_latency_p50_ms", latency(args.db, app, count), "ms"
                    ),
                )
    results.write(args.out)


if __name__ == "__main__":
    main()
