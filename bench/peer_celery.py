"""Celery 5 with Redis, the default choice of a Django team: ``delay()`` from web
code, a prefork worker at ``--concurrency 4``, and the two ways teams keep a task
from being queued twice.

- ``celery_delay``: ``noop.delay(i)``, ops/s (no dedupe at all)
- ``celery_delay_setnx`` / ``celery_duplicate_setnx``: ``SET dedupe:<key> NX EX`` then
  ``delay()`` when the lock was taken: new keys, then the same keys again (no task sent)
- ``celery_delay_once`` / ``celery_duplicate_once``: ``celery_once.QueueOnce``, new keys,
  then the same keys again (``AlreadyQueued``)
- ``celery_worker_c4``, ``celery_worker_c4_once``, ``celery_worker_c4_setnx``: the queued
  tasks through one worker process, tasks/s from the first completion to the last
  (the worker's clock, read from Redis)

Nothing here is durable: a task Redis has handed to a worker that dies is lost unless
``acks_late`` is on, and a dedupe lock outlives a lost task until it expires.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis
from celery_once import AlreadyQueued

from bench.celery_app import BROKER_URL, noop, noop_once, noop_setnx
from bench.common import Results, rate, stopwatch, suite_args, wanted

ROOT = Path(__file__).resolve().parent.parent
LOCK_SECONDS = 3600


def flush(client: redis.Redis) -> None:
    client.flushdb()


def worker(client: redis.Redis, n: int, timeout: float = 600) -> float:
    """Start a worker over what is queued, wait until ``n`` tasks ran, stop it."""
    for name in ("bench:first", "bench:last", "bench:done"):
        client.delete(name)
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "bench.celery_app",
        "worker",
        "--concurrency",
        "4",
        "--pool",
        "prefork",
        "--loglevel",
        "WARNING",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]
    process = subprocess.Popen(
        command, cwd=ROOT, env=os.environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + timeout
        while int(client.get("bench:done") or 0) < n:
            if process.poll() is not None:
                raise RuntimeError(f"celery worker exited: {process.stderr.read()[-500:]!r}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{client.get('bench:done')} of {n} tasks ran")
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    first, last = float(client.get("bench:first")), float(client.get("bench:last"))
    return rate(n, last - first)


def plain(results: Results, args, client: redis.Redis) -> None:
    flush(client)
    with stopwatch() as elapsed:
        for i in range(args.n):
            noop.delay(i)
    results.add("celery_delay", rate(args.n, elapsed()), "ops/s")
    if wanted(args, "celery_worker_c4"):
        results.add("celery_worker_c4", worker(client, args.n), "tasks/s")


def setnx(results: Results, args, client: redis.Redis, tag: str) -> None:
    flush(client)
    keys = [f"{tag}:{i}" for i in range(args.n)]

    def send(key: str) -> bool:
        if client.set(f"dedupe:{key}", 1, nx=True, ex=LOCK_SECONDS):
            noop_setnx.delay(key)
            return True
        return False

    with stopwatch() as elapsed:
        sent = sum(send(key) for key in keys)
    results.add("celery_delay_setnx", rate(args.n, elapsed()), "ops/s")
    with stopwatch() as elapsed:
        again = sum(send(key) for key in keys)
    results.add("celery_duplicate_setnx", rate(args.n, elapsed()), "ops/s")
    if sent != args.n or again:
        raise RuntimeError(f"SET NX dedupe sent {sent} then {again} of {args.n}")
    if wanted(args, "celery_worker_c4_setnx"):
        results.add("celery_worker_c4_setnx", worker(client, args.n), "tasks/s")


def once(results: Results, args, client: redis.Redis, tag: str) -> None:
    flush(client)
    keys = [f"{tag}:{i}" for i in range(args.n)]
    with stopwatch() as elapsed:
        for key in keys:
            noop_once.delay(key=key)
    results.add("celery_delay_once", rate(args.n, elapsed()), "ops/s")
    refused = 0
    with stopwatch() as elapsed:
        for key in keys:
            try:
                noop_once.delay(key=key)
            except AlreadyQueued:
                refused += 1
    results.add("celery_duplicate_once", rate(args.n, elapsed()), "ops/s")
    if refused != args.n:
        raise RuntimeError(f"celery_once refused {refused} of {args.n} duplicates")
    if wanted(args, "celery_worker_c4_once"):
        results.add("celery_worker_c4_once", worker(client, args.n), "tasks/s")


def main() -> None:
    args = suite_args(__doc__)
    results = Results()
    client = redis.Redis.from_url(BROKER_URL)
    client.ping()
    for repeat in range(args.repeats):
        print(f"celery, repeat {repeat + 1}", flush=True)
        if wanted(args, "celery_delay", "celery_worker_c4"):
            results.measure(
                ["celery_delay", "celery_worker_c4"], lambda: plain(results, args, client)
            )
        names = ["celery_delay_setnx", "celery_duplicate_setnx", "celery_worker_c4_setnx"]
        if wanted(args, *names):
            results.measure(names, lambda r=repeat: setnx(results, args, client, f"r{r}"))
        names = ["celery_delay_once", "celery_duplicate_once", "celery_worker_c4_once"]
        if wanted(args, *names):
            results.measure(names, lambda r=repeat: once(results, args, client, f"r{r}"))
    flush(client)
    results.write(args.out)


if __name__ == "__main__":
    main()
