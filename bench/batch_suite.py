"""django-durable's ``start_many``: N new keys in one ``start_many`` call
(``start_many_new_key``), and the same N again, all duplicates
(``start_many_duplicate``). Single starts (``start_new_key``) are measured by
``bench/durable_suite.py`` in the same run; the report sets the two side by side.

Its own entry (``python bench/batch_suite.py --db bench_batch --out result.json``,
the database migrated), like the other suites run by ``bench/run.py``.
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
django.setup()

from django.db import connection  # noqa: E402

import django_durable as durable  # noqa: E402
from bench.common import Results, rate, stopwatch, suite_args, wanted  # noqa: E402
from bench.workflows import BenchKeyed  # noqa: E402

METRICS = ["start_many_new_key", "start_many_duplicate"]


def truncate() -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE durable_run, durable_activity CASCADE")


def batch(results: Results, args, n: int, tag: str) -> None:
    items = [({"i": i}, f"{tag}:many:{i}") for i in range(n)]
    if wanted(args, "start_many_new_key", "start_many_duplicate"):
        with stopwatch() as elapsed:
            answers = durable.start_many(BenchKeyed, items)
        assert all(a.outcome == "started" for a in answers)
        results.add("start_many_new_key", rate(n, elapsed()), "ops/s")
    if wanted(args, "start_many_duplicate"):
        with stopwatch() as elapsed:
            answers = durable.start_many(BenchKeyed, items)
        assert all(a.outcome == "use_existing" for a in answers)
        results.add("start_many_duplicate", rate(n, elapsed()), "ops/s")


def main() -> None:
    args = suite_args(__doc__)
    results = Results()
    for repeat in range(args.repeats):
        print(f"django-durable start_many, repeat {repeat + 1}", flush=True)
        truncate()
        results.measure(METRICS, lambda repeat=repeat: batch(results, args, args.n, f"r{repeat}"))
    results.write(args.out)


if __name__ == "__main__":
    main()
