"""How close the flow claim can come to the plain one (docs/benchmarks.md, "Flow
control"): figures, never asserted. PostgreSQL, its own database (``BENCH_DB_NAME``,
by default ``bench_flow``), rebuilt at the start.

Two throwaway functions, created in the bench database only, bound what any claim
that takes fair turns across flow keys can cost beside one that does not:

- ``bench_floor_plain``: the smallest claim, one index scan of the due runs
  (``LIMIT``, ``FOR UPDATE SKIP LOCKED``), then the ``UPDATE``;
- ``bench_floor_fair``: the smallest claim in turns: the queue's pointer, a walk of
  the next keys in key order (wrapping), each key's next due run, the pointer moved,
  then the same ``UPDATE``. No limit, no slot, one queue, no priority levels across
  keys: what the real claim does besides that is not in it.

One thread claims up to 4 runs and finishes them, over 20,000 due runs of one queue
(without flow keys for the plain claims, with 20 keys for the others), the two
functions and ``store.claim`` (``durable_claim_v6``) alternating in each repeat:

    python -m bench.flow_floor [--repeat 5] [--claims 1500]

Each figure is the median milliseconds of a claim's round trip (the call, through
Django's cursor); a ratio is plain / flow (1.0: flow keys cost nothing).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta

from bench.flow_suite import FILL, FINISH, empty, limits, prepare_database

RUNS = 20_000
KEYS = 20
PER_CLAIM = 4
LEASE = timedelta(minutes=5)

# The floor functions by name: the statement that picks the runs into v_ids
# (FLOOR_FUNCTION follows it with the same UPDATE of those runs in each).
FLOOR_PICKS = {
    "plain": """
    SELECT array_agg(p.id) INTO v_ids FROM (
        SELECT r.id FROM durable_run AS r WHERE r.queue = p_queue
           AND durable_claimable_v1(r.status, r.due_at) AND r.due_at <= v_now
        ORDER BY r.priority DESC, r.due_at LIMIT p_limit FOR UPDATE SKIP LOCKED) AS p;
""",
    "fair": """
    WITH RECURSIVE walk(flow_key, n) AS (
        SELECT (SELECT t.flow_key FROM durable_flow_turn AS t WHERE t.queue = p_queue
                ORDER BY t.claimed_at DESC LIMIT 1)::varchar, 0
        UNION ALL
        SELECT COALESCE(
            (SELECT r.flow_key FROM durable_run AS r WHERE r.queue = p_queue
                AND r.flow_key > walk.flow_key AND durable_claimable_v1(r.status, r.due_at)
                AND r.flow_key IS NOT NULL ORDER BY r.flow_key LIMIT 1),
            (SELECT r.flow_key FROM durable_run AS r WHERE r.queue = p_queue
                AND durable_claimable_v1(r.status, r.due_at) AND r.flow_key IS NOT NULL
             ORDER BY r.flow_key LIMIT 1))::varchar, walk.n + 1
        FROM walk WHERE walk.n < p_limit
    ),
    picked AS MATERIALIZED (
        SELECT c.id, walk.flow_key, walk.n FROM walk CROSS JOIN LATERAL (
            SELECT r.id FROM durable_run AS r WHERE r.queue = p_queue AND r.flow_key = walk.flow_key
               AND durable_claimable_v1(r.status, r.due_at) AND r.due_at <= v_now
            ORDER BY r.priority DESC, r.due_at LIMIT 1 FOR UPDATE SKIP LOCKED) AS c
        WHERE walk.n > 0
    ),
    moved AS (
        INSERT INTO durable_flow_turn (queue, flow_key, claimed_at)
        SELECT p_queue, p.flow_key, v_now FROM (
            SELECT picked.flow_key FROM picked ORDER BY picked.n DESC LIMIT 1) AS p
        ON CONFLICT (queue, flow_key) DO UPDATE SET claimed_at = EXCLUDED.claimed_at
    )
    SELECT array_agg(picked.id) INTO v_ids FROM picked;
""",
}
FLOOR_FUNCTION = """
CREATE OR REPLACE FUNCTION bench_floor_{name}(p_queue text, p_limit integer, p_worker varchar)
RETURNS SETOF uuid LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off
AS $f$
DECLARE v_now timestamptz := statement_timestamp(); v_ids uuid[];
BEGIN
{pick}
    RETURN QUERY UPDATE durable_run AS d SET status = 'running', worker_id = p_worker,
        lease_expires_at = v_now + interval '5 min', fence = d.fence + 1,
        started_at = COALESCE(d.started_at, v_now)
    WHERE d.id = ANY (v_ids) RETURNING d.id;
END
$f$;
"""


def fill(keys: int) -> None:
    from django.db import connection

    empty()
    with connection.cursor() as cursor:
        cursor.execute(
            FILL,
            {
                "workflow": "flow_per_key" if keys else "flow_plain",
                "count": RUNS,
                "keys": keys,
                "prefix": "tenant:",
                "queues": ["flow"],
                "levels": [0],
                "sleeping": False,
                "shift": "0 ms",
            },
        )
        cursor.execute("VACUUM ANALYZE durable_run")


def timed_claims(claim, claims: int) -> float:
    """The median ms of ``claims`` calls of ``claim()`` (which returns run ids), each
    claim's runs finished after it is timed."""
    from django.db import connection

    spent = []
    for _ in range(claims):
        started = time.perf_counter()
        ids = claim()
        spent.append((time.perf_counter() - started) * 1000)
        with connection.cursor() as cursor:
            cursor.execute(FINISH, [ids])
    return statistics.median(spent[claims // 10 :])  # the first plans made, left out


def floor_claim(function: str):
    from django.db import connection

    def claim() -> list:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT * FROM {function}(%s, %s, %s)", ["flow", PER_CLAIM, "floor"])
            return [row[0] for row in cursor.fetchall()]

    return claim


def store_claim(limits: dict):
    from django_durable import store

    def claim() -> list:
        runs = store.claim(
            worker_id="floor", queues=["flow"], limit=PER_CLAIM, lease=LEASE, flow_limits=limits
        )
        return [r.id for r in runs]

    return claim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--claims", type=int, default=1500)
    args = parser.parse_args()
    prepare_database()
    from django.db import connection

    with connection.cursor() as cursor:
        for name, pick in FLOOR_PICKS.items():
            cursor.execute(FLOOR_FUNCTION.format(name=name, pick=pick))
    keyed_limits = limits(["flow_per_key"])  # concurrency_per_key 100, never reached
    cases = {
        "floor: plain": (0, floor_claim("bench_floor_plain")),
        "floor: fair turns, 20 keys": (KEYS, floor_claim("bench_floor_fair")),
        "store.claim: plain": (0, store_claim({})),
        "store.claim: 20 keys, limit 100": (KEYS, store_claim(keyed_limits)),
    }
    print(f"load average before: {os.getloadavg()}", flush=True)
    figures: dict[str, list[float]] = {name: [] for name in cases}
    for repeat in range(args.repeat):
        for name, (keys, claim) in cases.items():
            fill(keys)
            figures[name].append(timed_claims(claim, args.claims))
            print(f"  repeat {repeat + 1}: {name:34} {figures[name][-1]:.3f} ms", flush=True)
    median = {name: statistics.median(values) for name, values in figures.items()}
    for name, value in median.items():
        print(f"claim ms  {name:34} {value:.3f}")
    for plain, flow in (
        ("floor: plain", "floor: fair turns, 20 keys"),
        ("store.claim: plain", "store.claim: 20 keys, limit 100"),
        ("store.claim: plain", "floor: fair turns, 20 keys"),
    ):
        print(f"ratio     {plain} / {flow}: {median[plain] / median[flow]:.2f}x")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
