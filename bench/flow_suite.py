"""Flow limits, measured (docs/benchmarks.md, "Flow control"): figures and targets,
never asserted. PostgreSQL, its own database (``BENCH_DB_NAME``, by default
``bench_flow``), rebuilt at the start.

- ``claims``: runs claimed per second by 4 threads, each claiming up to 4 runs
  through ``store.claim`` and finishing them at once (what a worker of concurrency 4
  does, without the steps, so the claim is most of what is measured). Each case with
  flow keys is paired with the same runs without them (or without the sleeping runs,
  or without the idle declarations), measured in the same repeat, blocks in a
  rotating order; a pair's figure is the median of its ratios within each repeat.
  The claimer passes the limits of the case's workflows, as a worker passes those of
  its registered workflows.
- ``fairness``: a backlog of one key (1k / 10k / 100k due runs; 1M with
  ``--million``) and 10 runs of another due after all of it, one thread claiming one
  run at a time: at which claims the other key's runs began, and each claim's cost
  (median, p99 of 100). Then 20 times a run of a new key is made due while the thread
  claims the backlog: how many claims and milliseconds until it was claimed (its
  pickup). With the plans of the claim's statements (auto_explain, nested), whether
  any reads durable_run whole.

    python -m bench.flow_suite [--repeat 5] [--runs 2000] [--backlogs 1000,10000,100000]
                               [--million] [--plans DIR] [--claim durable_claim_v5]

``--claim`` calls another installed version of the claim function than the code's
(the previous release's, which its expand migration keeps): a before/after on one
tree and one database build.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

LEASE = timedelta(minutes=5)
THREADS = 4
PER_CLAIM = 4
CLAIMS = 100  # claims timed per backlog in the fairness case
PICKUPS = 20  # new keys made due, one at a time, per backlog
THREE_QUEUES = ("flow_a", "flow_b", "flow_c")

FILL = """
INSERT INTO durable_run (id, workflow, queue, status, priority, input, context, state,
                         step_index, attempt, fence, due_at, created_at, flow_key,
                         holds_key, recoveries, step_names, inputs)
SELECT gen_random_uuid(), %(workflow)s,
       (%(queues)s::text[])[1 + g %% cardinality(%(queues)s::text[])], 'pending',
       (%(levels)s::integer[])[1 + g %% cardinality(%(levels)s::integer[])],
       '{}', '{}', '{}', 0, 1, 0,
       CASE WHEN %(sleeping)s THEN timestamptz '2100-01-01'
            ELSE now() - interval '1 hour' + g * interval '1 ms' + %(shift)s::interval END,
       now(),
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


def declare_workflows() -> None:
    """The suite's workflows, registered in this process only (not in bench/workflows.py,
    which every worker of the main run loads: a declared limit there would be in
    ``worker_c4``'s claims too)."""
    import django_durable as durable
    from django_durable import Workflow, step

    def by_tenant(input):
        return f"tenant:{input.get('tenant', 0)}"

    class FlowPlain(Workflow):
        name = "flow_plain"  # no limit: its runs with or without a flow key

        @step
        def only(self, ctx): ...

    class FlowPerKey(FlowPlain):
        name = "flow_per_key"
        flow_key = staticmethod(by_tenant)
        concurrency_per_key = 100  # never reached: at most 16 run at once here

    class FlowPerKeyLarge(FlowPlain):
        name = "flow_per_key_large"
        flow_key = staticmethod(by_tenant)
        concurrency_per_key = 10_000  # never reached either, as worker_c4_flow's

    class FlowOnePerKey(FlowPlain):
        name = "flow_one_per_key"
        flow_key = staticmethod(by_tenant)
        concurrency_per_key = 1

    class FlowCapped(FlowPlain):
        name = "flow_capped"
        concurrency = 10

    class FlowRated(FlowPlain):
        name = "flow_rated"
        flow_key = staticmethod(by_tenant)
        rate_per_key = durable.Rate(100, per=durable.minutes(1))


@dataclass(frozen=True)
class Fill:
    workflow: str
    count: int
    keys: int = 0
    prefix: str = "tenant:"
    queues: tuple[str, ...] = ("flow",)
    levels: tuple[int, ...] = (0,)
    sleeping: bool = False
    shift: str = "0 ms"


@dataclass(frozen=True)
class Case:
    """What is in the table, and what the claimer serves and passes."""

    fills: tuple[Fill, ...]
    limited: tuple[str, ...] = ()  # the workflows whose declared limits are passed
    queues: tuple[str, ...] = ("flow",)

    @property
    def due(self) -> int:
        return sum(f.count for f in self.fills if not f.sleeping)


def fill(*fills: Fill, analyze: bool = True) -> None:
    """Insert the runs; ``analyze``: then ANALYZE (which makes every session plan its
    statements again at its next call: not while a pickup is timed)."""
    from django.db import connection

    with connection.cursor() as cursor:
        for f in fills:
            cursor.execute(
                FILL,
                {
                    "workflow": f.workflow,
                    "count": f.count,
                    "keys": f.keys,
                    "prefix": f.prefix,
                    "queues": list(f.queues),
                    "levels": list(f.levels),
                    "sleeping": f.sleeping,
                    "shift": f.shift,
                },
            )
        if analyze:
            cursor.execute("ANALYZE durable_run")


def empty() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE durable_run CASCADE")
        cursor.execute("TRUNCATE durable_flow_turn, durable_flow_rate_slot")


def limits(names) -> dict:
    """The declared limits of ``names``, as the claim takes them (those a worker
    serving these workflows passes)."""
    from django_durable.operations.flow import claim_limits

    declared = claim_limits()
    return {name: declared[name] for name in names if name in declared}


def claim_and_finish(case_limits, queues, limit: int, worker: str, spent=None) -> list:
    """One claim (its time in ms appended to ``spent``), then its runs finished."""
    from django.db import connection

    from django_durable import store

    started = time.perf_counter()
    runs = store.claim(
        worker_id=worker, queues=list(queues), limit=limit, lease=LEASE, flow_limits=case_limits
    )
    if spent is not None:
        spent.append((time.perf_counter() - started) * 1000)
    if runs:
        with connection.cursor() as cursor:
            cursor.execute(FINISH, [[r.id for r in runs]])
    return runs


def drain_rate(case: Case) -> float:
    """Runs claimed (and finished) per second by THREADS threads until every due run
    was claimed (an empty claim while another thread holds a key is part of it)."""
    from django.db import connection

    empty()
    fill(*case.fills)
    case_limits = limits(case.limited)
    total = case.due
    done = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + 300

    def work(n: int) -> None:
        try:
            while done[0] < total and time.monotonic() < deadline:
                got = claim_and_finish(case_limits, case.queues, PER_CLAIM, f"bench-{n}")
                with lock:
                    done[0] += len(got)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(THREADS)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    assert done[0] == total, (done[0], total)  # every due run claimed once: a check
    return total / seconds


def cases(runs: int) -> tuple[dict[str, Case], list[tuple[str, str, str, float]]]:
    """The measurements, and the pairs compared: (label, with, without, target ratio)."""
    keyed = Fill("flow_per_key", runs, keys=20)
    sleepers = (
        Fill("flow_per_key", 1000, keys=20, sleeping=True),
        Fill("flow_capped", 1000, sleeping=True),
    )
    levels, queues = (0, 5, 9), THREE_QUEUES
    measured = {
        "plain": Case((Fill("flow_plain", runs),)),
        "20 keys, limit 100 not reached": Case((keyed,), ("flow_per_key",)),
        "20 keys, limit 10,000 not reached": Case(
            (Fill("flow_per_key_large", runs, keys=20),), ("flow_per_key_large",)
        ),
        "20 keys, at the limit (1 per key)": Case(
            (Fill("flow_one_per_key", runs, keys=20),), ("flow_one_per_key",)
        ),
        "20 keys, no limit declared": Case((Fill("flow_plain", runs, keys=20),)),
        "2,000 keys, limit not reached": Case(
            (Fill("flow_per_key", runs, keys=2000),), ("flow_per_key",)
        ),
        "plain, 3 levels": Case((Fill("flow_plain", runs, levels=levels),)),
        "20 keys, 3 levels": Case(
            (Fill("flow_per_key", runs, keys=20, levels=levels),), ("flow_per_key",)
        ),
        "plain, 3 queues": Case((Fill("flow_plain", runs, queues=queues),), (), queues),
        "20 keys, 3 queues": Case(
            (Fill("flow_per_key", runs, keys=20, queues=queues),), ("flow_per_key",), queues
        ),
        "plain, limits passed": Case((Fill("flow_plain", runs),), ("flow_per_key", "flow_capped")),
        "plain + 2,000 limited runs sleeping": Case(
            (Fill("flow_plain", runs), *sleepers), ("flow_per_key", "flow_capped")
        ),
        "plain, idle concurrency + rate_per_key declared": Case(
            (Fill("flow_plain", runs),), ("flow_capped", "flow_rated")
        ),
        "one hot key, limit 100 not reached": Case(
            (Fill("flow_per_key", runs, keys=1, prefix="hot"),), ("flow_per_key",)
        ),
        "one hot key, no limit declared": Case((Fill("flow_plain", runs, keys=1, prefix="hot"),)),
    }
    pairs = [
        ("20 keys, limit 100 not reached", "20 keys, limit 100 not reached", "plain", 0.9),
        ("20 keys, limit 10,000 not reached", "20 keys, limit 10,000 not reached", "plain", 0.9),
        ("20 keys, at the limit", "20 keys, at the limit (1 per key)", "plain", 0.9),
        ("20 keys, no limit declared", "20 keys, no limit declared", "plain", 0.9),
        ("2,000 keys, limit not reached", "2,000 keys, limit not reached", "plain", 0.9),
        ("mixed priorities (3 levels)", "20 keys, 3 levels", "plain, 3 levels", 0.9),
        ("several queues (3) per key", "20 keys, 3 queues", "plain, 3 queues", 0.9),
        (
            "limited runs sleeping beside plain due runs",
            "plain + 2,000 limited runs sleeping",
            "plain, limits passed",
            0.9,
        ),
        (
            "idle concurrency + rate_per_key declared",
            "plain, idle concurrency + rate_per_key declared",
            "plain",
            1.0,
        ),
        ("one hot key, limit 100 not reached", "one hot key, limit 100 not reached", "plain", 0.9),
        ("one hot key, no limit declared", "one hot key, no limit declared", "plain", 0.9),
    ]
    return measured, pairs


def claims(args) -> tuple[dict[str, float], list[dict]]:
    """Each measurement's runs/s (median of ``--repeat``), and each pair's ratio (the
    median of its ratios within each repeat)."""
    measured, pairs = cases(args.runs)
    names = list(measured)
    seen: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(args.repeat):
        shift = repeat % len(names)  # a rotating order: no case always first after a fill
        for name in names[shift:] + names[:shift]:
            seen[name].append(drain_rate(measured[name]))
            print(f"  repeat {repeat + 1}: {name:50} {seen[name][-1]:8.0f} runs/s", flush=True)
    rates = {name: statistics.median(values) for name, values in seen.items()}
    compared = []
    for label, with_, without, target in pairs:
        ratios = [a / b for a, b in zip(seen[with_], seen[without], strict=True)]
        ratio = statistics.median(ratios)
        compared.append(
            {
                "pair": label,
                "with": round(rates[with_]),
                "without": round(rates[without]),
                "ratio": round(ratio, 2),
                "ratios": [round(r, 2) for r in ratios],
                "target": target,
                # "about 1.0x" for what should cost nothing: within the noise of 0.95
                "met": ratio >= (0.95 if target == 1.0 else target),
            }
        )
    return rates, compared


def plans_of_claim(case_limits) -> str:
    """The plans of every statement one claim of one run ran, with their times
    (auto_explain, nested statements, as notices to this session). Rolled back."""
    from django.db import connection, transaction

    from django_durable import store

    notices: list[str] = []
    with transaction.atomic():
        connection.ensure_connection()
        handler = notices.append
        connection.connection.add_notice_handler(lambda d: handler(d.message_primary or ""))
        with connection.cursor() as cursor:
            cursor.execute("LOAD 'auto_explain'")
            for name, value in (
                ("log_min_duration", "0"),
                ("log_analyze", "on"),
                ("log_buffers", "on"),
                ("log_nested_statements", "on"),
                ("log_level", "notice"),
            ):
                cursor.execute(f"SET LOCAL auto_explain.{name} = {value}")
        store.claim(
            worker_id="explain", queues=["flow"], limit=1, lease=LEASE, flow_limits=case_limits
        )
        transaction.set_rollback(True)  # the explained claim is not kept
    connection.close()  # the notice handler and the loaded module go with the session
    return "\n\n".join(notices)


def fairness(backlog: int) -> dict:
    from django.db import connection

    empty()
    fill(
        Fill("flow_per_key", backlog, keys=1, prefix="big:"),
        Fill("flow_per_key", 10, keys=1, prefix="small:", shift="59 minutes"),
    )  # the 10 are due after the whole backlog
    case_limits = limits(["flow_per_key"])
    plan = plans_of_claim(case_limits)
    costs, picked_at = [], []
    for n in range(1, CLAIMS + 1):
        [run] = claim_and_finish(case_limits, ["flow"], 1, "fair", costs)
        if run.flow_key.startswith("small:"):
            picked_at.append(n)
    pickup_ms, pickup_claims = [], []
    for n in range(PICKUPS):
        fill(
            Fill("flow_per_key", 1, keys=1, prefix=f"new{n}:", shift="3599 seconds"), analyze=False
        )
        made_due = time.perf_counter()
        for claims_made in range(1, 1000):
            [run] = claim_and_finish(case_limits, ["flow"], 1, "fair")
            if run.flow_key.startswith(f"new{n}:"):
                pickup_ms.append((time.perf_counter() - made_due) * 1000)
                pickup_claims.append(claims_made)
                break
    connection.close()
    costs.sort()
    pickup_ms.sort()
    return {
        "backlog": backlog,
        "other key began at claims": picked_at,
        "claim median ms": round(statistics.median(costs), 2),
        "claim p99 ms": round(costs[int(0.99 * (len(costs) - 1))], 2),
        "new key claimed within (claims, max)": max(pickup_claims),
        "new key pickup p50 ms": round(statistics.median(pickup_ms), 2),
        "new key pickup p99 ms": round(pickup_ms[int(0.99 * (len(pickup_ms) - 1))], 2),
        "plan": plan,
    }


def plan_summary(plan: str) -> str:
    """The statements' times and whether any scanned durable_run whole."""
    durations = [float(d) for d in re.findall(r"duration: ([\d.]+) ms", plan)]
    nested = sorted(durations[:-1], reverse=True)[:3]  # the last is the call itself
    seq = "Seq Scan on durable_run " in plan
    return (
        f"{len(durations) - 1} statements, the call {durations[-1] if durations else 0:.2f} ms "
        f"(under auto_explain), slowest {nested} ms, seq scan of durable_run: {seq}"
    )


def prepare_database() -> None:
    """The suite's database rebuilt and migrated, Django set up on it, the suite's
    workflows declared."""
    from bench.common import migrate, recreate_database, suite_env

    database = os.environ.get("BENCH_DB_NAME", "bench_flow")
    recreate_database(database)
    migrate(suite_env(database))
    setup_django()
    declare_workflows()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--backlogs", default="1000,10000,100000")
    parser.add_argument("--million", action="store_true", help="also a backlog of 1M (minutes)")
    parser.add_argument("--skip-claims", action="store_true", help="only the fairness case")
    parser.add_argument("--plans", help="a directory to write each backlog's plans to")
    parser.add_argument("--claim", help="an installed claim function to call instead")
    args = parser.parse_args()
    prepare_database()
    from django_durable.store.engines import postgres
    from django_durable.store.functions import CURRENT

    if args.claim:  # the engine's statement, calling that version
        postgres.CLAIM = postgres.CLAIM.replace(f"{CURRENT['durable_claim']}(", f"{args.claim}(")
    called = re.search(r"FROM (durable_claim_v\d+)", postgres.CLAIM)[1]
    print(f"claim function: {called}")
    print(f"load average before: {os.getloadavg()}", flush=True)
    if not args.skip_claims:
        rates, compared = claims(args)
        for name, rate in rates.items():
            print(f"claims/s  {name:50} {rate:8.0f}")
        for pair in compared:
            print(
                f"pair      {pair['pair']:45} {pair['with']:6} / {pair['without']:6} = "
                f"{pair['ratio']:.2f}x {pair['ratios']}  target {pair['target']}x: "
                f"{'met' if pair['met'] else 'NOT met'}"
            )
    backlogs = [int(b) for b in args.backlogs.split(",")] + ([1_000_000] if args.million else [])
    for backlog in backlogs:
        result = fairness(backlog)
        plan = result.pop("plan")
        print(f"fairness  {result}  explain: {plan_summary(plan)}", flush=True)
        if args.plans:
            Path(args.plans).mkdir(parents=True, exist_ok=True)
            Path(args.plans, f"flow_claim_{backlog}.txt").write_text(plan + "\n")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
