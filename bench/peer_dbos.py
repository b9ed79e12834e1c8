"""DBOS, as its docs use it: a client enqueues workflows with a workflow id (its key),
and a launched DBOS process runs them from its queue.

- ``dbos_start``: ``DBOSClient.enqueue`` with a new ``workflow_id``, ops/s
- ``dbos_worker``: two-step no-op workflows through one DBOS process at the queue's
  defaults, workflows/s from the first start to the last success (database timestamps)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

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

QUEUE = "bench"


def serve(db: str, mode: str) -> None:
    """``setup``: create DBOS's tables and the queue, then exit; ``work``: run the queue."""
    from dbos import DBOS

    DBOS(config={"name": "bench", "system_database_url": dsn(db), "log_level": "WARNING"})

    @DBOS.step()
    def first(i: int) -> None:
        return None

    @DBOS.step()
    def second(i: int) -> None:
        return None

    @DBOS.workflow(name="two_steps")
    def two_steps(i: int) -> None:
        first(i)
        second(i)

    DBOS.launch()
    DBOS.register_queue(QUEUE)
    print("ready", flush=True)
    if mode == "setup":
        DBOS.destroy()
        return
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    DBOS.destroy()


def spawn(db: str, mode: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.peer_dbos", "--serve", db, mode],
        env=os.environ,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    if line.strip() != "ready":
        process.kill()
        raise RuntimeError(f"DBOS did not launch (said {line!r})")
    return process


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def starts(client, n: int, tag: str) -> float:
    with stopwatch() as elapsed:
        for i in range(n):
            client.enqueue(
                {"workflow_name": "two_steps", "queue_name": QUEUE, "workflow_id": f"{tag}:{i}"}, i
            )
    return rate(n, elapsed())


def work(db: str, n: int) -> float:
    """Run the ``n`` queued workflows through one DBOS process."""
    process = spawn(db, "work")
    try:
        deadline = time.monotonic() + max(120, n / 20)
        with connect(db) as conn:
            while True:
                done = conn.execute(
                    "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'"
                ).fetchone()[0]
                if done >= n:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{done} of {n} workflows succeeded")
                time.sleep(0.2)
            seconds = conn.execute(
                "SELECT (max(updated_at) - min(started_at_epoch_ms)) / 1000.0 "
                "FROM dbos.workflow_status WHERE status = 'SUCCESS'"
            ).fetchone()[0]
    finally:
        stop(process)
    return rate(n, float(seconds))


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2], sys.argv[3])
        return
    args = suite_args(__doc__)
    results = Results()
    recreate_database(args.db)
    stop(spawn(args.db, "setup"))
    from dbos import DBOSClient

    client = DBOSClient(system_database_url=dsn(args.db))
    try:
        for repeat in range(args.repeats):
            print(f"DBOS, repeat {repeat + 1}", flush=True)
            with connect(args.db) as conn:
                conn.execute("TRUNCATE dbos.workflow_status CASCADE")
            results.measure(
                ["dbos_start"],
                lambda repeat=repeat: results.add(
                    "dbos_start", starts(client, args.n, f"r{repeat}"), "ops/s"
                ),
            )
            if wanted(args, "dbos_worker"):
                results.measure(
                    ["dbos_worker"],
                    lambda: results.add("dbos_worker", work(args.db, args.n), "runs/s"),
                )
    finally:
        client.destroy()
    results.write(args.out)


if __name__ == "__main__":
    main()
