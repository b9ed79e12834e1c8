"""Flow control by key, measured (docs/benchmarks.md, "Flow control"): figures, never
asserted. PostgreSQL, its own database (``BENCH_DB_NAME``, by default
``bench_flow``), rebuilt at the start.

- ``claims``: runs claimed per second by 4 threads, each claiming up to 4 runs and
  finishing them at once (what a worker of concurrency 4 does, without the steps):
  without flow keys, with flow keys (20 keys) and a limit never reached, at the limit
  (20 keys, ``concurrency_per_key = 1``), the unlimited claim of the same 20 keys,
  and 2,000 keys (one run each) with a limit never reached. Blocks alternate, the
  median of ``--repeat`` is kept; with ``--compare``, each case is also measured
  through an older claim function, its blocks interleaved.
- ``fairness``: a backlog of one key (1k / 10k / 100k due runs), then 10 runs of
  another, one thread claiming one run at a time: after how many claims each of the
  other key's runs began (p99 of the 10), and the claim's cost (median and p99 ms
  over the first 100 claims, the claim alone), with the EXPLAIN ANALYZE of the claim
  (its one statement) at that backlog.

    python -m bench.flow_suite [--repeat 3] [--runs 2000] [--backlogs 1000,10000,100000]
                               [--compare durable_claim_v3]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import threading
import time
from datetime import timedelta
from pathlib import Path

LEASE = timedelta(minutes=5)
KEYS = 20
THREADS = 4
PER_CLAIM = 4
CLAIMS = 100  # claims timed per backlog in the fairness case

FILL = """
INSERT INTO durable_run (id, workflow, queue, status, input, context, state, step_index,
                         attempt, fence, due_at, created_at, flow_key, holds_key,
                         recoveries, step_names, inputs)
SELECT gen_random_uuid(), %(workflow)s, 'flow', 'pending', '{}', '{}', '{}', 0, 1, 0,
       now() - interval '1 hour' + g * interval '1 ms' + %(shift)s::interval, now(),
       CASE WHEN %(keys)s::integer > 0 THEN %(prefix)s || (g %% %(keys)s::integer) END,
       false, 0, '[]', '[]'
FROM generate_series(1, %(count)s::integer) AS g
"""

FINISH = """
UPDATE durable_run SET status = 'completed', finished_at = now(), due_at = NULL,
       worker_id = NULL, lease_expires_at = NULL
WHERE id = ANY (%s)
"""


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    os.environ.setdefault("BENCH_DB_NAME", "bench_flow")
    import django

    django.setup()


def fill(count: int, *, keys: int, prefix: str = "tenant:", shift: str = "0 ms") -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            FILL,
            {
                "workflow": "flowed",
                "count": count,
                "keys": keys,
                "prefix": prefix,
                "shift": shift,
            },
        )
        cursor.execute("ANALYZE durable_run")


def empty() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE durable_run CASCADE")
        cursor.execute("TRUNCATE durable_flow_turn")


def limits(key_cap: int | None):
    from django_durable.store.flow import FlowLimit

    return {"flowed": FlowLimit(key_cap, None, None, None)} if key_cap else {}


def claim_and_finish(limit: int, flow_limits, worker: str, spent: list | None = None) -> list:
    """One claim (its time in ms appended to ``spent``), then its runs finished."""
    from django.db import connection

    from django_durable import store

    started = time.perf_counter()
    runs = store.claim(
        worker_id=worker, queues=["flow"], limit=limit, lease=LEASE, flow_limits=flow_limits
    )
    if spent is not None:
        spent.append((time.perf_counter() - started) * 1000)
    if runs:
        with connection.cursor() as cursor:
            cursor.execute(FINISH, [[r.id for r in runs]])
    return runs


def drain_rate(runs: int, keys: int, key_cap: int | None) -> float:
    """Runs claimed (and finished) per second by THREADS threads until none is due."""
    from django.db import connection

    empty()
    fill(runs, keys=keys)
    flow_limits = limits(key_cap)
    done = [0] * THREADS

    def work(n: int) -> None:
        idle = 0
        try:
            while idle < 3:
                got = claim_and_finish(PER_CLAIM, flow_limits, f"bench-{n}")
                done[n] += len(got)
                idle = 0 if got else idle + 1
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(THREADS)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    assert sum(done) == runs, (sum(done), runs)  # every run claimed once: a check, not a time
    return runs / seconds


def use_claim_function(name: str) -> None:
    """Make the store's CLAIM call ``name`` (a version of durable_claim its migration
    kept installed), to measure two versions side by side in one run."""
    from django_durable.store.engines import postgres

    postgres.CLAIM = re.sub(r"durable_claim_v\d+\(", f"{name}(", postgres.CLAIM)


def claims(args) -> dict[str, float]:
    """Each case's runs/s (median of ``--repeat``), per claim function: the current
    one, and ``--compare``'s when given, blocks interleaved."""
    from django_durable.store.functions import CURRENT

    cases = {
        "no flow key": (0, None),
        "flow keys, limit not reached": (KEYS, 10_000),
        "flow keys, unlimited": (KEYS, None),
        "at the limit (20 keys, 1 per key)": (KEYS, 1),
        "2,000 flow keys, limit not reached": (2_000, 10_000),
    }
    functions = [CURRENT["durable_claim"]] + ([args.compare] if args.compare else [])
    seen: dict[str, list[float]] = {
        f"{name} [{function}]": [] for name in cases for function in functions
    }
    for _ in range(args.repeat):
        for name, (keys, cap) in cases.items():
            for function in functions:
                use_claim_function(function)
                seen[f"{name} [{function}]"].append(drain_rate(args.runs, keys, cap))
    use_claim_function(CURRENT["durable_claim"])
    return {name: statistics.median(rates) for name, rates in seen.items()}


def explain_claim(flow_limits, limit: int = 1) -> str:
    """EXPLAIN ANALYZE of the flow path's claim in one statement (the current
    durable_claim's step 2, its generic plan as the function keeps it), for a claim of
    ``limit`` runs of the queue "flow": its walk of the queue's keys from its pointer
    and its claim of each key's first due run. Rolled back."""
    from django.db import connection, transaction

    from django_durable.store.functions import CURRENT, definition

    create = definition(CURRENT["durable_claim"])
    found = re.search(
        r"RETURN QUERY\s+(WITH RECURSIVE queue\(room, pointer\).*?RETURNING durable_run\.\*);",
        create,
        re.S,
    )
    query = re.sub(r"\bv_name\b", "'flow'::text", found.group(1))
    signature = re.search(r"FUNCTION \w+\((.*?)\)\s*RETURNS", create, re.S).group(1)
    arguments = [argument.split() for argument in signature.split(",")]
    for number, (name, _type) in enumerate(arguments, 1):
        query = re.sub(rf"\b{name}\b", f"${number}", query)
    types = ", ".join(type_ for _name, type_ in arguments)
    names = sorted(flow_limits)
    values = [
        ["flow"], limit, [], [], None, [], "explain", LEASE, names,
        [flow_limits[n].key_cap for n in names], [flow_limits[n].cap for n in names],
        [flow_limits[n].rate for n in names], [flow_limits[n].per for n in names],
    ]  # fmt: skip
    with transaction.atomic(), connection.cursor() as cursor:
        for name, value in re.findall(r"^SET (\w+) = (\w+)$", create, re.M):
            cursor.execute(f"SET LOCAL {name} = {value}")  # the function's settings
        cursor.execute(f"PREPARE flow_claim({types}) AS {query}")
        placeholders = ", ".join(["%s"] * len(values))
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE flow_claim({placeholders})", values)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("DEALLOCATE flow_claim")
        transaction.set_rollback(True)  # the explained claim is not kept
    return plan


def fairness(backlog: int) -> dict:
    empty()
    fill(backlog, keys=1, prefix="big:")
    fill(10, keys=1, prefix="small:", shift="59 minutes")  # due after the whole backlog
    flow_limits = limits(10_000)
    plan = explain_claim(flow_limits)
    costs, picked_at = [], []
    for n in range(1, CLAIMS + 1):
        [run] = claim_and_finish(1, flow_limits, "fair", costs)
        if run.flow_key.startswith("small:"):
            picked_at.append(n)
    costs.sort()
    return {
        "backlog": backlog,
        "other key picked at claims": picked_at,
        "pickup p99 (claims)": picked_at[-1] if len(picked_at) == 10 else None,
        "claim median ms": round(statistics.median(costs), 2),
        "claim p99 ms": round(costs[int(0.99 * (len(costs) - 1))], 2),
        "plan": plan,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--backlogs", default="1000,10000,100000")
    parser.add_argument("--plans", help="a directory to write each backlog's EXPLAIN to")
    parser.add_argument(
        "--compare",
        metavar="FUNCTION",
        help="also measure the claims with this installed version (durable_claim_v3)",
    )
    args = parser.parse_args()
    from bench.common import migrate, recreate_database, suite_env

    database = os.environ.get("BENCH_DB_NAME", "bench_flow")
    recreate_database(database)
    migrate(suite_env(database))
    setup_django()
    print(f"load average before: {os.getloadavg()}")
    for name, rate in claims(args).items():
        print(f"claims/s  {name:56} {rate:8.0f}")
    for backlog in (int(b) for b in args.backlogs.split(",")):
        result = fairness(backlog)
        plan = result.pop("plan")
        executed = " + ".join(re.findall(r"Execution Time: ([\d.]+) ms", plan))
        seq = "Seq Scan on durable_run " in plan
        print(f"fairness  {result}  explain {executed} ms, seq scan of durable_run: {seq}")
        if args.plans:
            Path(args.plans, f"flow_claim_{backlog}.txt").write_text(plan + "\n")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
