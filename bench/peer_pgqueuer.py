"""pgqueuer, as its docs use it: sync ``enqueue`` from web code with a ``dedupe_key``,
and an async ``QueueManager`` at its defaults (batches of 10).

- ``pgqueuer_enqueue_dedupe``: enqueue with a new ``dedupe_key``, ops/s
- ``pgqueuer_enqueue_unprepared``: the same on a connection that prepares nothing
  (psycopg's ``prepare_threshold=None``, as behind PgBouncer in transaction mode):
  the enqueue parsed and planned at every call, as a start's statement is with
  Django's defaults. For comparison like for like; the target names the one above
- ``pgqueuer_duplicate``: enqueue with a key already queued (raises ``DuplicateJobError``)
- ``pgqueuer_enqueue_batch``: one ``enqueue`` call with lists of N jobs, each with its
  own new ``dedupe_key``, ops/s
- ``pgqueuer_worker``: one-step no-op jobs, jobs/s from the first ``picked`` log row
  to the last ``successful`` one (database timestamps)
"""

from __future__ import annotations

import asyncio

import psycopg
from pgqueuer import QueueManager
from pgqueuer.adapters.drivers.psycopg import PsycopgDriver, SyncPsycopgDriver
from pgqueuer.domain.errors import DuplicateJobError
from pgqueuer.domain.types import QueueExecutionMode
from pgqueuer.queries import Queries, SyncQueries

from bench.common import (
    Results,
    connect,
    dsn,
    rate,
    recreate_database,
    stopwatch,
    suite_args,
    wanted,
)


async def install(db: str) -> None:
    conn = await psycopg.AsyncConnection.connect(dsn(db), autocommit=True)
    async with conn:
        await Queries(PsycopgDriver(conn)).install()


def truncate(db: str) -> None:
    with connect(db) as conn:
        conn.execute("TRUNCATE pgqueuer, pgqueuer_log")


def enqueue_new_keys(queries: SyncQueries, keys: list[str]) -> float:
    """Enqueue one job per key (each key new); the seconds it took."""
    with stopwatch() as elapsed:
        for i, key in enumerate(keys):
            queries.enqueue("noop", b"%d" % i, dedupe_key=key)
    return elapsed()


def enqueues(
    results: Results, args, queries: SyncQueries, unprepared: SyncQueries, tag: str
) -> None:
    keys = [f"{tag}:{i}" for i in range(args.n)]
    seconds = enqueue_new_keys(queries, keys)
    results.add("pgqueuer_enqueue_dedupe", rate(args.n, seconds), "ops/s")
    if wanted(args, "pgqueuer_duplicate"):
        with stopwatch() as elapsed:
            for i, key in enumerate(keys):
                try:
                    queries.enqueue("noop", b"%d" % i, dedupe_key=key)
                except DuplicateJobError:
                    pass
                else:
                    raise RuntimeError("a duplicate enqueue was accepted")
        results.add("pgqueuer_duplicate", rate(args.n, elapsed()), "ops/s")
    if wanted(args, "pgqueuer_enqueue_batch"):
        batch_keys = [f"{tag}:batch:{i}" for i in range(args.n)]
        with stopwatch() as elapsed:
            ids = queries.enqueue(
                ["noop"] * args.n,
                [b"%d" % i for i in range(args.n)],
                [0] * args.n,
                dedupe_key=batch_keys,
            )
        if len(ids) != args.n:
            raise RuntimeError(f"{len(ids)} of {args.n} batch jobs enqueued")
        results.add("pgqueuer_enqueue_batch", rate(args.n, elapsed()), "ops/s")
    # Last, on an empty table as the first: the figures above are taken as they always were.
    if wanted(args, "pgqueuer_enqueue_unprepared"):
        truncate(args.db)
        seconds = enqueue_new_keys(unprepared, [f"{tag}:unprepared:{i}" for i in range(args.n)])
        results.add("pgqueuer_enqueue_unprepared", rate(args.n, seconds), "ops/s")


async def drain(db: str, n: int) -> float:
    conn = await psycopg.AsyncConnection.connect(dsn(db), autocommit=True)
    async with conn:
        queries = Queries(PsycopgDriver(conn))
        await queries.enqueue(["noop"] * n, [b"%d" % i for i in range(n)], [0] * n)
        qm = QueueManager(queries)

        @qm.entrypoint("noop")
        async def noop(job) -> None:
            return None

        await qm.run(mode=QueueExecutionMode.drain)
    with connect(db) as sync:
        done, seconds = sync.execute(
            "SELECT count(*) FILTER (WHERE status = 'successful'), EXTRACT(EPOCH FROM "
            "max(created) FILTER (WHERE status = 'successful') "
            "- min(created) FILTER (WHERE status = 'picked')) FROM pgqueuer_log"
        ).fetchone()
    if done != n:
        raise RuntimeError(f"{done} of {n} jobs succeeded")
    return rate(n, float(seconds))


def main() -> None:
    args = suite_args(__doc__)
    results = Results()
    recreate_database(args.db)
    asyncio.run(install(args.db))
    with (
        psycopg.connect(dsn(args.db), autocommit=True) as conn,
        psycopg.connect(dsn(args.db), autocommit=True, prepare_threshold=None) as plain,
    ):
        queries = SyncQueries(SyncPsycopgDriver(conn))
        unprepared = SyncQueries(SyncPsycopgDriver(plain))
        for repeat in range(args.repeats):
            print(f"pgqueuer, repeat {repeat + 1}", flush=True)
            truncate(args.db)
            enqueue_metrics = [
                "pgqueuer_enqueue_dedupe",
                "pgqueuer_enqueue_unprepared",
                "pgqueuer_duplicate",
                "pgqueuer_enqueue_batch",
            ]
            if wanted(args, *enqueue_metrics):
                results.measure(
                    enqueue_metrics,
                    lambda repeat=repeat: enqueues(
                        results, args, queries, unprepared, f"r{repeat}"
                    ),
                )
            if wanted(args, "pgqueuer_worker"):
                truncate(args.db)
                results.measure(
                    ["pgqueuer_worker"],
                    lambda: results.add(
                        "pgqueuer_worker", asyncio.run(drain(args.db, args.n)), "jobs/s"
                    ),
                )
    results.write(args.out)


if __name__ == "__main__":
    main()
