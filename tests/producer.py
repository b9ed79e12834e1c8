"""A producer process for the deployment tests: keyed starts, as a web process makes them.

    python -m tests.producer --keys 200 --seed 1
    python -m tests.producer --rate 25 --stop-file /tmp/stop --prefix a

The first starts ``keyed_once`` once for each of the keys ``key-0`` ... ``key-199``
in an order shuffled by ``--seed``. The second starts it for the keys ``a-0``,
``a-1``, ... at ``--rate`` starts a second until the file ``--stop-file`` exists,
timing each start. Both use the test settings (environment variables say which
database and port) and print one JSON line: the outcome counts, the run id each key
answered with, every error as text, and the starts' latencies (count, p50, p99,
max, in seconds). Each start is its own autocommit statement, as in a view without
``ATOMIC_REQUESTS``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path


def keys_once(count: int, seed: int) -> Iterator[tuple[str, int]]:
    numbers = list(range(count))
    random.Random(seed).shuffle(numbers)
    for n in numbers:
        yield f"key-{n}", n


def keys_at_rate(rate: float, stop_file: Path, prefix: str) -> Iterator[tuple[str, int]]:
    """Keys at ``rate`` a second (on a fixed schedule: a slow start is not made up by
    sleeping less, but by starting the next ones at once) until ``stop_file`` exists."""
    at = time.monotonic()
    n = 0
    while not stop_file.exists():
        time.sleep(max(0.0, at - time.monotonic()))
        yield f"{prefix}-{n}", n
        n += 1
        at += 1 / rate


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate", type=float)
    parser.add_argument("--stop-file", type=Path)
    parser.add_argument("--prefix", default="key")
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    import django_durable as durable
    from tests.testapp.workflows import KeyedOnce

    if args.rate:
        keys = keys_at_rate(args.rate, args.stop_file, args.prefix)
    else:
        keys = keys_once(args.keys, args.seed)
    outcomes: Counter[str] = Counter()
    answered: dict[str, str] = {}
    errors: list[str] = []
    latencies: list[float] = []
    for key, n in keys:
        started = time.perf_counter()
        try:
            result = durable.start_detailed(KeyedOnce, {"n": n}, key=key)
        except Exception as exc:  # counted, never hidden: the test asserts there are none
            errors.append(f"{key}: {type(exc).__name__}: {exc}")
            continue
        finally:
            latencies.append(time.perf_counter() - started)
        outcomes[result.outcome] += 1
        answered[key] = str(result.run_id)
    latency = {
        "count": len(latencies),
        "p50": quantile(latencies, 0.5),
        "p99": quantile(latencies, 0.99),
        "max": max(latencies, default=0.0),
    }
    json.dump(
        {"outcomes": outcomes, "answered": answered, "errors": errors, "latency": latency},
        sys.stdout,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
