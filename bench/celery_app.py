"""The Celery app of the Celery peer (``bench/peer_celery.py``): Redis as broker, no
result backend, as most Django projects run it. Its tasks count what they ran in Redis
so the benchmark reads throughput from the worker's own clock.

- ``noop``: a no-op task.
- ``noop_once``: the same behind ``celery_once.QueueOnce`` (a Redis lock per
  arguments, taken by ``delay()`` and released when the task ends).
- ``noop_setnx``: the dedupe teams write by hand: ``SET key NX EX`` before
  ``delay()``, deleted by the task when it ends.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery
from celery_once import QueueOnce

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
# A database number of its own: the benchmark flushes it.
BROKER_URL = os.environ.get("BENCH_CELERY_BROKER", "redis://127.0.0.1:6379/9")

app = Celery("bench", broker=BROKER_URL)
app.conf.update(
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=4,
    broker_connection_retry_on_startup=True,
    ONCE={
        "backend": "celery_once.backends.Redis",
        "settings": {"url": BROKER_URL, "default_timeout": 3600},
    },
)

_counter: redis.Redis | None = None


def counter() -> redis.Redis:
    global _counter
    if _counter is None:
        _counter = redis.Redis.from_url(BROKER_URL)
    return _counter


def _done() -> None:
    """The first and the last completion time, and how many ran (three commands in one
    round trip)."""
    at = time.time()
    pipe = counter().pipeline(transaction=False)
    pipe.set("bench:first", at, nx=True)
    pipe.set("bench:last", at)
    pipe.incr("bench:done")
    pipe.execute()


@app.task(name="noop")
def noop(i: int = 0) -> None:
    _done()


@app.task(name="noop_once", base=QueueOnce, once={"keys": ["key"]})
def noop_once(key: str = "") -> None:
    _done()


@app.task(name="noop_setnx")
def noop_setnx(key: str = "") -> None:
    _done()
    counter().delete(f"dedupe:{key}")
