"""The soak: constant keyed traffic for minutes, a worker at concurrency 4 with
pruning on, and what the runs table does meanwhile.

    python -m bench.soak --out soak.json [--minutes 10] [--rate 150]

A producer (this process) starts ``--rate`` runs a second of ``bench_soak``: 70% on a
new key, 30% on a key started in the last few seconds (a duplicate: the workflow keeps
a completed run's key until it is pruned). One ``durable_worker --concurrency 4``
runs them and prunes every 15 s what finished more than 120 s ago. Every
``--sample-seconds`` a sampler reads, from the database: runs finished and claimed
in the interval, the claim latency (``started_at - created_at``: the producer's
start to the worker's claim), the backlog (due and unclaimed), the sizes of the runs
table and its indexes, and ``pg_stat_user_tables`` (live and dead tuples, HOT
updates, autovacuum runs). Each minute is summed up the same way.

Run by ``bench/run.py --soak`` on a cluster of its own with autovacuum on
(``bench/cluster.py``); ``DJANGO_SETTINGS_MODULE=bench.settings``, database migrated.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter, deque

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
django.setup()

from django.db import connection  # noqa: E402

import django_durable as durable  # noqa: E402
from bench.common import connect  # noqa: E402
from bench.durable_suite import ROOT, worker_command  # noqa: E402
from bench.workflows import BenchSoak  # noqa: E402

RETENTION_SECONDS = 120
PRUNE_SECONDS = 15
DUPLICATES = 0.30
RECENT_KEYS = 1000
# What --untuned resets: the autovacuum settings of migration 0001.
UNTUNED = (
    "autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, "
    "autovacuum_vacuum_insert_scale_factor, autovacuum_vacuum_insert_threshold, "
    "autovacuum_analyze_scale_factor, autovacuum_analyze_threshold"
)

WINDOW_SQL = """
SELECT
  (SELECT count(*) FROM durable_run WHERE workflow = 'bench_soak'
     AND finished_at > %(since)s AND finished_at <= %(until)s),
  (SELECT count(*) FROM durable_run WHERE workflow = 'bench_soak'
     AND started_at > %(since)s AND started_at <= %(until)s),
  (SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (
          ORDER BY EXTRACT(EPOCH FROM started_at - created_at) * 1000)
     FROM durable_run WHERE workflow = 'bench_soak'
     AND started_at > %(since)s AND started_at <= %(until)s)
"""

TABLE_SQL = """
SELECT pg_relation_size('durable_run'), pg_indexes_size('durable_run'),
       pg_total_relation_size('durable_step_attempt'),
       s.n_live_tup, s.n_dead_tup, s.n_tup_upd, s.n_tup_hot_upd, s.autovacuum_count,
       (SELECT count(*) FROM durable_run WHERE status = 'pending' AND due_at <= now()),
       now()
FROM pg_stat_user_tables s WHERE s.relname = 'durable_run'
"""


class Sampler(threading.Thread):
    """Reads the database every ``every`` seconds on a connection of its own."""

    def __init__(self, db: str, every: float) -> None:
        super().__init__(daemon=True)
        self.db, self.every = db, every
        self.samples: list[dict] = []
        self.minutes: list[dict] = []
        self.stop = threading.Event()

    def window(self, conn, since, until) -> dict:
        finished, claimed, pcts = conn.execute(
            WINDOW_SQL, {"since": since, "until": until}
        ).fetchone()
        p50, p99 = pcts if pcts else (None, None)
        seconds = (until - since).total_seconds()
        return {
            "finished_per_s": round(finished / seconds, 1),
            "claimed_per_s": round(claimed / seconds, 1),
            "claim_p50_ms": None if p50 is None else round(p50, 1),
            "claim_p99_ms": None if p99 is None else round(p99, 1),
        }

    def tables(self, conn) -> dict:
        row = conn.execute(TABLE_SQL).fetchone()
        keys = [
            "table_bytes",
            "index_bytes",
            "attempts_bytes",
            "live_tuples",
            "dead_tuples",
            "updates",
            "hot_updates",
            "autovacuums",
            "backlog",
            "at",
        ]
        return dict(zip(keys, row, strict=True))

    def run(self) -> None:
        with connect(self.db) as conn:
            begin = last = minute_start = self.tables(conn)["at"]
            while not self.stop.wait(self.every):
                tables = self.tables(conn)
                at = tables.pop("at")
                self.samples.append(
                    {
                        "t": round((at - begin).total_seconds(), 1),
                        **self.window(conn, last, at),
                        **tables,
                    }
                )
                last = at
                if (at - minute_start).total_seconds() >= 60:
                    self.minutes.append(
                        {
                            "minute": len(self.minutes) + 1,
                            **self.window(conn, minute_start, at),
                            **tables,
                        }
                    )
                    minute_start = at


def produce(rate: float, seconds: float) -> Counter:
    """Start ``rate`` runs a second for ``seconds``: 30% on a recent key."""
    outcomes: Counter = Counter()
    recent: deque[str] = deque(maxlen=RECENT_KEYS)
    chooser = random.Random(17)
    begin = time.monotonic()
    i = 0
    while (elapsed := time.monotonic() - begin) < seconds:
        pause = begin + i / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        if recent and chooser.random() < DUPLICATES:
            key = chooser.choice(recent)
        else:
            key = f"k{i}"
            recent.append(key)
        outcomes[durable.start_detailed(BenchSoak, {"i": i}, key=key).outcome] += 1
        i += 1
    outcomes["seconds"] = round(elapsed)
    return outcomes


def reloptions() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'durable_run'")
        return list(cursor.fetchone()[0] or [])


def soak(db: str, minutes: float, rate: float, every: float) -> dict:
    env = {
        **os.environ,
        "BENCH_RUN_RETENTION_SECONDS": str(RETENTION_SECONDS),
        "BENCH_PRUNE_INTERVAL_SECONDS": str(PRUNE_SECONDS),
    }
    log = open(os.devnull, "w")  # noqa: SIM115 - the worker's stdout, closed below
    worker = subprocess.Popen(
        worker_command("--concurrency", "4"), cwd=ROOT, env=env, stdout=log, stderr=log
    )
    sampler = Sampler(db, every)
    try:
        time.sleep(2)
        if worker.poll() is not None:
            raise RuntimeError(f"durable_worker exited {worker.returncode}")
        sampler.start()
        outcomes = produce(rate, minutes * 60)
        sampler.stop.set()
        sampler.join(timeout=60)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        log.close()
    return summarise(sampler, outcomes, minutes, rate)


def summarise(sampler: Sampler, outcomes: Counter, minutes: float, rate: float) -> dict:
    rows = sampler.minutes
    summary: dict = {}
    if rows:
        first, last = rows[0], rows[-1]
        summary["throughput_last_over_first"] = (
            round(last["finished_per_s"] / first["finished_per_s"], 3)
            if first["finished_per_s"]
            else None
        )
        # Bounded: the biggest size after pruning began (minute 3 on) against the end.
        later = rows[2:] or rows
        summary["table_bytes_max_from_minute_3"] = max(r["table_bytes"] for r in later)
        summary["table_bytes_at_end"] = last["table_bytes"]
        summary["index_bytes_max_from_minute_3"] = max(r["index_bytes"] for r in later)
        summary["index_bytes_at_end"] = last["index_bytes"]
        summary["dead_tuples_max"] = max(r["dead_tuples"] for r in rows)
        updates = last["updates"] or 0
        summary["hot_update_share"] = round(last["hot_updates"] / updates, 3) if updates else None
    starts = sum(v for k, v in outcomes.items() if k != "seconds")
    return {
        "minutes": minutes,
        "target_rate": rate,
        "starts": starts,
        "outcomes": dict(outcomes),
        "duplicate_share": round(outcomes.get("use_existing", 0) / starts, 3) if starts else None,
        "retention_seconds": RETENTION_SECONDS,
        "prune_interval_seconds": PRUNE_SECONDS,
        "runs_table_reloptions": reloptions(),
        "summary": summary,
        "per_minute": rows,
        "samples": sampler.samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rate", type=float, default=150)
    parser.add_argument("--sample-seconds", type=float, default=10)
    parser.add_argument("--untuned", action="store_true", help="the table's defaults")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    db = connection.settings_dict["NAME"]
    if args.untuned:
        with connection.cursor() as cursor:
            for table in ("durable_run", "durable_step_attempt"):
                cursor.execute(f"ALTER TABLE {table} RESET ({UNTUNED})")
    connection.close()
    result = soak(db, args.minutes, args.rate, args.sample_seconds)
    result["untuned"] = args.untuned
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
