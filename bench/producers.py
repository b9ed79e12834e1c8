"""Many producers: 8 processes start runs at once, as 8 web processes would, half of
the starts on 100 hot keys, while a worker at concurrency 4 finishes them (so hot
keys keep changing hands: duplicates, hand-offs and races between them).

    python -m bench.producers --out producers.json [--processes 8] [--seconds 30]

Each producer starts ``bench_hot`` runs as fast as it can for ``--seconds``: 50% on
one of 100 hot keys, 50% on a key of its own. A start that raises
``durable.KeyContended`` (the key changed hands three times during it, documented
as safe to retry) is counted and retried; any other exception is an error, counted
with its type. Afterwards: at most one holder per key (the database's unique
constraint says so; this counts it again) and every hot key held by exactly one run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import subprocess
import time
from collections import Counter

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
django.setup()

from django.db import connection, connections  # noqa: E402

import django_durable as durable  # noqa: E402
from bench.durable_suite import ROOT, truncate, worker_command  # noqa: E402
from bench.workflows import BenchHot  # noqa: E402

HOT_KEYS = 100


def producer(index: int, seconds: float, start_at: float, queue) -> None:
    connections.close_all()  # a connection of its own, not the parent's
    chooser = random.Random(index)
    counts: Counter = Counter()
    hot_used: set[str] = set()
    while time.time() < start_at:
        time.sleep(0.01)
    end = start_at + seconds
    i = 0
    while time.time() < end:
        hot = chooser.random() < 0.5
        key = f"hot:{chooser.randrange(HOT_KEYS)}" if hot else f"p{index}:{i}"
        if hot:
            hot_used.add(key)
        i += 1
        while True:
            try:
                outcome = durable.start_detailed(BenchHot, {"p": index, "i": i}, key=key).outcome
            except durable.KeyContended:
                counts["key_contended_retries"] += 1
                continue
            except Exception as exc:  # counted, never hidden: the figure must be 0
                counts[f"error:{type(exc).__name__}"] += 1
                break
            counts[outcome] += 1
            counts["starts"] += 1
            break
    connections.close_all()
    queue.put({"counts": dict(counts), "hot_used": sorted(hot_used)})


def holders() -> dict:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE n > 1), count(*) FILTER (WHERE key LIKE 'hot:%%'), "
            "coalesce(sum(n) FILTER (WHERE key LIKE 'hot:%%'), 0) FROM ("
            "  SELECT key, count(*) AS n FROM durable_run WHERE workflow = %s AND holds_key "
            "  GROUP BY key) AS k",
            [BenchHot.name],
        )
        doubled, hot_held, hot_holders = (int(v) for v in cursor.fetchone())
    return {
        "keys_with_two_holders": doubled,
        "hot_keys_held": hot_held,
        "hot_key_holders": hot_holders,
    }


def run(processes: int, seconds: float) -> dict:
    truncate()
    connection.close()
    log = open(os.devnull, "w")  # noqa: SIM115 - closed below
    worker = subprocess.Popen(
        worker_command("--concurrency", "4"), cwd=ROOT, env=os.environ, stdout=log, stderr=log
    )
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    start_at = time.time() + 3
    children = [
        context.Process(target=producer, args=(i, seconds, start_at, queue))
        for i in range(processes)
    ]
    try:
        for child in children:
            child.start()
        per_process = [queue.get(timeout=seconds + 120) for _ in children]
        for child in children:
            child.join(timeout=30)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        log.close()
    total: Counter = Counter()
    hot_used: set[str] = set()
    for reported in per_process:
        total.update(reported["counts"])
        hot_used.update(reported["hot_used"])
    per_process = [reported["counts"] for reported in per_process]
    errors = {k: v for k, v in total.items() if k.startswith("error:")}
    result = {
        "processes": processes,
        "seconds": seconds,
        "hot_keys": HOT_KEYS,
        "hot_keys_started": len(hot_used),
        "starts": total["starts"],
        "starts_per_s": round(total["starts"] / seconds, 1),
        "outcomes": {
            k: v
            for k, v in total.items()
            if k not in ("starts", "key_contended_retries") and not k.startswith("error:")
        },
        "key_contended_retries": total["key_contended_retries"],
        "errors": errors,
        "error_count": sum(errors.values()),
        "per_process_starts": [c.get("starts", 0) for c in per_process],
        **holders(),
    }
    result["exactly_one_holder_per_hot_key"] = (
        result["keys_with_two_holders"] == 0
        and result["hot_keys_held"] == len(hot_used)
        and result["hot_key_holders"] == len(hot_used)
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = run(args.processes, args.seconds)
    print(json.dumps(result, indent=1), flush=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
