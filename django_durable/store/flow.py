"""Flow control by key, the store's part (docs/flow-control.md): the flow limits as
the claim takes them, SQLite's claim with limits and turns, and the turns it records.

On PostgreSQL the whole of it is in durable_claim_v2 (its file in migrations/sql says
how the limits stay exact across workers: an advisory lock per limited workflow,
then a fresh snapshot, in one round trip). SQLite serialises writers, so its claim
(CLAIM_SQLITE) counts and claims in one UPDATE; the turns it gave go in after it
(TAKE_TURNS_SQLITE), only when it claimed a run with a flow key. Turns only order
the claims (no limit depends on them), so they need no transaction with it.

The limits come from the workflows' declarations, which the store does not read:
``source`` is set by the app (apps.py) to a function returning them, as
``observers`` are; a caller may also pass them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

__all__ = [
    "CLAIM_SQLITE",
    "FlowLimit",
    "flow_params",
    "served_limits",
    "source",
    "take_turns_sqlite",
]


class FlowLimit(NamedTuple):
    """One workflow's flow limits as the claim takes them (None: no such limit)."""

    key_cap: int | None
    cap: int | None
    rate: int | None
    per: timedelta | None


# Set by the app: the flow limits of the registered workflows, by name (None: none).
source: Callable[[], Mapping[str, FlowLimit]] | None = None


def served_limits(
    limits: Mapping[str, FlowLimit] | None,
    workflows: Sequence[str] | None,
    prefixes: Sequence[str],
) -> dict[str, FlowLimit]:
    """The limits of the workflows a claimer serves (``workflows`` None: any), by
    default those of ``source``."""
    if limits is None:
        limits = source() if source is not None else {}
    if not limits or workflows is None:
        return dict(limits)
    known = set(workflows)
    return {
        name: limit
        for name, limit in limits.items()
        if name in known or any(name.startswith(p) for p in prefixes)
    }


def flow_params(limits: Mapping[str, FlowLimit], postgres: bool, at: datetime, connection) -> dict:
    """The claim's flow parameters: arrays for durable_claim_v2 (in name order), or
    for CLAIM_SQLITE one JSON object of workflow -> [key_cap, cap, rate, window
    start], the window's start (now less ``per``) in the form SQLite stores times."""
    names = sorted(limits)
    if postgres:
        return {
            "flow_workflows": names,
            "key_caps": [limits[n].key_cap for n in names],
            "flow_caps": [limits[n].cap for n in names],
            "rates": [limits[n].rate for n in names],
            "pers": [limits[n].per for n in names],
        }
    adapt = connection.ops.adapt_datetimefield_value
    return {
        "flow": json.dumps(
            {
                n: [
                    limits[n].key_cap,
                    limits[n].cap,
                    limits[n].rate,
                    adapt(at - limits[n].per) if limits[n].per is not None else None,
                ]
                for n in names
            }
        )
    }


# The claim on SQLite, which serialises writers (no row locks, and no advisory lock:
# every count and the claim are one write): the due runs of the queues in
# %(queues)s (a JSON list; NULL: every queue) that are not paused, of the workflows
# served, ranked in turns (priority first, then round by round across the flow keys
# of a queue: the first due run of each key, then the second..., within a round the
# key whose turn in durable_flow_turn is oldest first; runs without a flow key are
# one key), and of a limited queue (%(caps)s, queue -> limit) or a workflow with flow
# limits (%(flow)s, FLOW_PARAMS) only what the limits leave: a queue's and a
# workflow's room beside their running runs, a flow key's beside its running runs,
# and its begins since the rate's window start. A rank computed before a filter
# drops a run can only leave the claim with fewer runs, never past a limit.
CLAIM_SQLITE = """
UPDATE durable_run SET
    status = CASE WHEN status = 'compensating' THEN 'compensating' ELSE 'running' END,
    due_at = CASE WHEN status = 'compensating' THEN NULL ELSE due_at END,
    worker_id = %(worker_id)s,
    lease_expires_at = %(lease_expires_at)s,
    fence = fence + 1,
    started_at = COALESCE(started_at, %(now)s)
WHERE id IN (
    SELECT ranked.id FROM (
        SELECT c.*,
               ROW_NUMBER() OVER (PARTITION BY c.queue ORDER BY c.priority DESC, c.round,
                                  c.turn_at IS NOT NULL, c.turn_at, c.due_at) AS n,
               ROW_NUMBER() OVER (PARTITION BY c.workflow ORDER BY c.priority DESC, c.round,
                                  c.turn_at IS NOT NULL, c.turn_at, c.due_at) AS workflow_n,
               ROW_NUMBER() OVER (PARTITION BY c.workflow, c.flow_key
                                  ORDER BY c.priority DESC, c.due_at) AS key_n,
               ROW_NUMBER() OVER (PARTITION BY c.workflow, c.flow_key, c.started_at IS NULL
                                  ORDER BY c.priority DESC, c.due_at) AS begin_n
        FROM (
            SELECT r.id, r.queue, r.workflow, r.flow_key, r.priority, r.due_at, r.started_at,
                   turn.claimed_at AS turn_at,
                   ROW_NUMBER() OVER (PARTITION BY r.queue, COALESCE(r.flow_key, '')
                                      ORDER BY r.priority DESC, r.due_at) AS round
            FROM durable_run AS r
            LEFT JOIN durable_flow_turn AS turn
                   ON turn.queue = r.queue AND turn.flow_key = COALESCE(r.flow_key, '')
            WHERE r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
              AND r.due_at <= %(now)s
              AND (%(queues)s IS NULL OR r.queue IN (SELECT value FROM json_each(%(queues)s)))
              AND r.queue NOT IN (SELECT name FROM durable_queue WHERE paused)
              AND (%(workflows)s IS NULL
                   OR r.workflow IN (SELECT value FROM json_each(%(workflows)s))
                   OR EXISTS (SELECT 1 FROM json_each(%(prefixes)s) AS p
                              WHERE substr(r.workflow, 1, length(p.value)) = p.value))
        ) AS c
    ) AS ranked
    LEFT JOIN json_each(%(caps)s) AS cap ON cap.key = ranked.queue
    LEFT JOIN json_each(%(flow)s) AS lim ON lim.key = ranked.workflow
    WHERE (cap.key IS NULL OR ranked.n <= cap.value - (
        SELECT count(*) FROM durable_run AS held
        WHERE held.queue = ranked.queue AND held.status IN ('running', 'compensating')
          AND held.lease_expires_at IS NOT NULL))
      AND (lim.key IS NULL OR (
        (json_extract(lim.value, '$[1]') IS NULL
         OR ranked.workflow_n <= json_extract(lim.value, '$[1]') - (
            SELECT count(*) FROM durable_run AS held
            WHERE held.workflow = ranked.workflow AND held.status IN ('running', 'compensating')
              AND held.lease_expires_at IS NOT NULL))
        AND (ranked.flow_key IS NULL OR (
            (json_extract(lim.value, '$[0]') IS NULL
             OR ranked.key_n <= json_extract(lim.value, '$[0]') - (
                SELECT count(*) FROM durable_run AS held
                WHERE held.workflow = ranked.workflow AND held.flow_key = ranked.flow_key
                  AND held.status IN ('running', 'compensating')
                  AND held.lease_expires_at IS NOT NULL))
            AND (json_extract(lim.value, '$[2]') IS NULL OR ranked.started_at IS NOT NULL
                 OR ranked.begin_n <= json_extract(lim.value, '$[2]') - (
                    SELECT count(*) FROM durable_run AS begun
                    WHERE begun.workflow = ranked.workflow AND begun.flow_key = ranked.flow_key
                      AND begun.started_at > json_extract(lim.value, '$[3]')))))))
    ORDER BY ranked.priority DESC, ranked.round, ranked.turn_at IS NOT NULL, ranked.turn_at,
             ranked.due_at
    LIMIT %(limit)s
)
RETURNING *
"""

# The turns a claim gave on SQLite (%(turns)s: a JSON list of [queue, flow key or
# ""]): each (queue, flow key) was claimed from at %(now)s.
TAKE_TURNS_SQLITE = """
INSERT INTO durable_flow_turn (queue, flow_key, claimed_at)
SELECT json_extract(t.value, '$[0]'), json_extract(t.value, '$[1]'), %(now)s
FROM json_each(%(turns)s) AS t
WHERE true
ON CONFLICT (queue, flow_key) DO UPDATE SET claimed_at = excluded.claimed_at
"""


def take_turns_sqlite(runs: Sequence[Any], at: datetime, connection) -> None:
    """Record the turns of the runs a claim took (SQLite), when one has a flow key:
    a claim of runs without any leaves the table alone (nothing to take turns with)."""
    if not any(run.flow_key is not None for run in runs):
        return
    turns = sorted({(run.queue, run.flow_key or "") for run in runs})
    with connection.cursor() as cursor:
        cursor.execute(TAKE_TURNS_SQLITE, {"turns": json.dumps(turns), "now": at})


def limits_of(declared: Mapping[str, Any]) -> dict[str, FlowLimit]:
    """FlowLimit by workflow name from declarations (``workflows.flow.FlowLimits``)."""
    return {
        name: FlowLimit(
            limits.concurrency_per_key,
            limits.concurrency,
            limits.rate.limit if limits.rate is not None else None,
            limits.rate.per if limits.rate is not None else None,
        )
        for name, limits in declared.items()
    }
