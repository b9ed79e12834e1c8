"""Starts runs in, and reports on, a database the test cannot reach itself (a cluster of
its own, tests/own_cluster.py). Prints one JSON line.

    python -m tests.cluster_probe start --runs 200 --pause 0.1
    python -m tests.cluster_probe start --runs 200 --gap 0.02 --retry-for 60
    python -m tests.cluster_probe report
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter


def start(
    runs: int, pause: float, gap: float = 0.0, retry_for: float = 0.0, first: int = 0
) -> dict:
    """Keyed starts; with ``retry_for``, a start that raised is made again with the same
    key (as a web process retries a request through a failover) until it succeeds or
    ``retry_for`` seconds passed: the key makes the retry safe whether or not the first
    one committed. ``started`` counts the starts that returned."""
    from django.db import connection

    import django_durable as durable

    errors, started, retried = [], 0, 0
    for n in range(first, first + runs):
        give_up_at = time.monotonic() + retry_for
        while True:
            try:
                durable.start("restart_steps", {"pause": pause}, key=f"restart:{n}")
                started += 1
                break
            except Exception as exc:  # counted: the test asserts there are none
                connection.close()  # the next attempt connects again (another host)
                if time.monotonic() < give_up_at:
                    retried += 1
                    time.sleep(0.05)
                    continue
                errors.append(f"{n}: {type(exc).__name__}: {exc}")
                break
        if gap:
            time.sleep(gap)
    outcome = {"started": started, "errors": errors}
    return {**outcome, "retried": retried} if retry_for else outcome


UNFINISHED = ("id", "status", "step_index", "worker_id", "lease_expires_at", "due_at", "recoveries")


def report() -> dict:
    from django.db.models import Count

    from django_durable.models import Run, StepAttempt
    from tests.testapp.models import Execution

    runs = Run.objects.filter(workflow="restart_steps")
    executions = Counter(
        (str(run_id), step) for run_id, step in Execution.objects.values_list("run_id", "step")
    )
    lost = Counter(
        (str(run_id), step)
        for run_id, step in StepAttempt.objects.filter(status="lost").values_list("run_id", "step")
    )
    holders = runs.filter(holds_key=True).values("key").annotate(n=Count("id"))
    repeats = [
        {"run": run, "step": step, "executions": n, "lost_attempts": lost[(run, step)]}
        for (run, step), n in sorted(executions.items())
        if n > 1
    ]
    return {
        "runs": runs.count(),
        "statuses": dict(Counter(runs.values_list("status", flat=True))),
        "keys": runs.values("key").distinct().count(),
        "holders_per_key": sorted({row["n"] for row in holders}),
        "keys_held": len(holders),
        "executions": sum(executions.values()),
        "steps_executed": len(executions),
        "repeats": repeats,
        "recoveries": sum(runs.values_list("recoveries", flat=True)),
        "lost_attempts": sum(lost.values()),
        "lost_kinds": dict(
            Counter(
                error["type"]
                for error in StepAttempt.objects.filter(status="lost").values_list(
                    "error", flat=True
                )
            )
        ),
        "failed_errors": [r.error for r in runs.filter(status="failed")[:5]],
        # What a run that never finished was doing (the test shows it when it waits in vain).
        "unfinished": [
            {field: str(value) for field, value in row.items()}
            for row in runs.exclude(status__in=("completed", "failed")).values(*UNFINISHED)[:5]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["start", "report"])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--gap", type=float, default=0.0)
    parser.add_argument("--retry-for", type=float, default=0.0)
    parser.add_argument("--first", type=int, default=0, help="the number of the first key")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    if args.what == "start":
        result = start(args.runs, args.pause, args.gap, args.retry_for, args.first)
    else:
        result = report()
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
