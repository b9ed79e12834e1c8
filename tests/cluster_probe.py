"""Starts runs in, and reports on, a database the test cannot reach itself (a cluster of
its own, tests/own_cluster.py). Prints one JSON line.

    python -m tests.cluster_probe start --runs 200 --pause 0.1
    python -m tests.cluster_probe report
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter


def start(runs: int, pause: float) -> dict:
    import django_durable as durable

    errors, started = [], 0
    for n in range(runs):
        try:
            durable.start("restart_steps", {"pause": pause}, key=f"restart:{n}")
            started += 1
        except Exception as exc:  # counted: the test asserts there are none
            errors.append(f"{n}: {type(exc).__name__}: {exc}")
    return {"started": started, "errors": errors}


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
        "failed_errors": [r.error for r in runs.filter(status="failed")[:5]],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["start", "report"])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--pause", type=float, default=0.0)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    result = start(args.runs, args.pause) if args.what == "start" else report()
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
