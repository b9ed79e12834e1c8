"""The SQLite engine: every statement django-durable runs on SQLite that is not the
ORM's, in one place (Oban's ``Oban.Engines.Lite`` beside ``Basic``).

SQLite is one file on one machine: it serialises writers (no row locks, no advisory
locks), has no NOTIFY (workers poll), no server to ask (doctor's questions answer
None), no functions of the store, and keeps its dates as text. Each statement
PostgreSQL runs that SQLite does without is ``None`` here, with what the store does
instead; a statement both run unchanged is PostgreSQL's, taken from ``postgres.py``
(Oban's ``defdelegate``), not written twice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django_durable.store.engines import postgres

# The engine's name: the vendor it serves (Django's ``connection.vendor``).
NAME = "sqlite"

# --- what this database does ------------------------------------------------------

# One machine: this process's clock is the database's (no offset to measure).
SERVER_CLOCK = False
# Writers take turns (a worker's threads mostly wait: system check W001).
SERIALISES_WRITERS = True
# No LISTEN/NOTIFY: idle workers poll (POLL_INTERVAL).
LISTENS = False
# No batch statements: ``start_many`` starts item by item, a worker records each last
# step alone.
BATCHES = False
# Dates are text: a claimed row needs the backend's converters (``Run.objects.raw``).
ROWS_NEED_BACKEND_CONVERTERS = True

# --- the clock and waking workers ---------------------------------------------------

# None: the clock is this process's.
READ_CLOCK = None
# None: no NOTIFY; idle workers poll (POLL_INTERVAL).
NOTIFY = None
# None: no LISTEN.
LISTEN = None

# --- starting runs -------------------------------------------------------------------

# PostgreSQL's, unchanged: standard SQL (``ON CONFLICT DO NOTHING`` with
# ``durable_run_one_holder_per_key`` arbitrating, ``RETURNING``).
INSERT_RUN = postgres.INSERT_RUN
# None: a start is INSERT_RUN, then the holder read through the ORM
# (``holders.get_holder``), and the caller records a duplicate itself.
START = None
# None: a hand-off is the same three writes through the ORM, in a transaction.
HAND_OFF = None
# None: ``start_many`` starts item by item.
START_BATCH = None

# --- claiming ------------------------------------------------------------------------

# None: SQLite's transactions are serialisable writers; no level to set.
CLAIM_LEVEL = None
# CLAIM leaves the slots NULL: the store gives them in the claim's transaction
# (store/slots.py), after CLAIM's serialised count.
CLAIM_GIVES_SLOTS = False

# Claim up to %(limit)s due runs in one statement (SQLite serialises writers: no row
# locks, no advisory lock, every count and the claim are one write): the due runs of the queues in
# %(queues)s (a JSON list; NULL: every queue) that are not paused, of the workflows
# served, ranked in turns (priority first, then round by round across the flow keys
# of a queue: the first due run of each key, then the second..., within a round the
# key whose turn in durable_flow_turn is oldest first; runs without a flow key are
# one key), and of a limited queue (%(caps)s, queue -> limit) or a workflow with flow
# limits (%(flow)s, flow_params) only what the limits leave: a queue's and a
# workflow's room beside their running runs, a flow key's beside its running runs,
# and its begins since the rate's window start. A rank computed before a filter
# drops a run can only leave the claim with fewer runs, never past a limit.
CLAIM = """
UPDATE durable_run SET
    status = CASE WHEN status = 'compensating' THEN 'compensating' ELSE 'running' END,
    due_at = CASE WHEN status = 'compensating' THEN NULL ELSE due_at END,
    worker_id = %(worker_id)s,
    lease_expires_at = %(lease_expires_at)s,
    fence = fence + 1,
    started_at = COALESCE(started_at, %(now)s),
    flow_slot = NULL, workflow_slot = NULL, queue_slot = NULL
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
            WHERE status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
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
TAKE_TURNS = """
INSERT INTO durable_flow_turn (queue, flow_key, claimed_at)
SELECT json_extract(t.value, '$[0]'), json_extract(t.value, '$[1]'), %(now)s
FROM json_each(%(turns)s) AS t
WHERE true
ON CONFLICT (queue, flow_key) DO UPDATE SET claimed_at = excluded.claimed_at
"""

# None: the next due time is one ORM query (``claims.next_due_at``).
NEXT_DUE_AT = None
# None: the queue depth is one ORM aggregate (``depth.queue_depths``).
QUEUE_DEPTH = None
# None: dates are text and the clock is this process's: the same update through the
# ORM (``timers.advance_timers``).
ADVANCE_TIMERS = None

# --- recording steps -----------------------------------------------------------------

# None: the fenced UPDATE and the attempt's INSERT through the ORM, in a transaction.
RECORD_STEP = None
# None: no completion batches (the worker records each last step alone).
RECORD_LAST_STEPS = None

# --- streams (docs/streams.md) ---------------------------------------------------------

# None: no NOTIFY (readers poll).
NOTIFY_MANY = None
# None: a read is the ORM's two queries (its dates need the backend's converters; readers
# poll here, so the second round trip costs no latency a NOTIFY would save).
READ_STREAM = None
# None: no CTE may write on SQLite; the store runs UPSERT_STREAM, then
# INSERT_STREAM_ITEM once or twice, in one transaction (SQLite serialises writers).
WRITE_STREAM = None

# WRITE_STREAM's ``stream`` part alone (its comment says what it does): create or
# raise the stream's row, while the writer's claim owns the run; no row back: nothing
# was written. The WHERE of the SELECT is what tells SQLite's parser the ON CONFLICT
# belongs to the INSERT.
UPSERT_STREAM = """
INSERT INTO durable_stream AS s (
    run_id, name, items, step_index, fence, reset, latest, closed_at, updated_at
)
SELECT id, %(name)s, 1, %(step_index)s, %(fence)s, 0,
       CASE WHEN %(keep_latest)s THEN %(value)s END, NULL, %(now)s
FROM durable_run
WHERE id = %(run_id)s AND fence = %(fence)s AND status IN ('running', 'compensating')
ON CONFLICT (run_id, name) DO UPDATE SET
    items = s.items + 1
        + CASE WHEN s.step_index = excluded.step_index AND s.fence < excluded.fence
          THEN 1 ELSE 0 END,
    reset = s.step_index = excluded.step_index AND s.fence < excluded.fence,
    step_index = excluded.step_index,
    fence = excluded.fence,
    latest = CASE WHEN %(keep_latest)s THEN excluded.latest ELSE s.latest END,
    updated_at = excluded.updated_at
WHERE s.closed_at IS NULL AND s.fence <= excluded.fence
  AND s.items + 1 + CASE WHEN s.step_index = excluded.step_index AND s.fence < excluded.fence
                    THEN 1 ELSE 0 END <= %(max_items)s
RETURNING items, reset
"""

# One item of a stream, at the offset UPSERT_STREAM took (durable_stream_item_once
# makes a duplicate offset impossible).
INSERT_STREAM_ITEM = """
INSERT INTO durable_stream_item (run_id, stream, "offset", kind, value, step, attempt, written_at)
VALUES (%(run_id)s, %(name)s, %(offset)s, %(kind)s, %(value)s, %(step)s, %(attempt)s, %(now)s)
"""

# Close a stream (``writer.close()``), creating its row if nobody wrote to it yet.
CLOSE_STREAM = """
INSERT INTO durable_stream AS s (run_id, name, items, reset, closed_at, updated_at)
VALUES (%(run_id)s, %(name)s, 0, 0, %(now)s, %(now)s)
ON CONFLICT (run_id, name) DO UPDATE SET closed_at = COALESCE(s.closed_at, excluded.closed_at)
RETURNING items, NULL
"""

# --- maintenance -----------------------------------------------------------------------

# None: writers take turns; two pruners cannot delete the same batch at once.
TRY_PRUNE_LOCK = None
# None: a SQLite file is never a standby.
REFUSES_WRITES = None

# --- what doctor and the dashboard ask the server ---------------------------------------

# None: there is no server to ask (doctor says so).
LISTENING_SESSIONS = None
# None: no server, no connection limit.
CONNECTION_LIMITS = None
# None: no planner statistics; the dashboard counts.
STATUS_ESTIMATES = None
# None: no functions of the store.
INSTALLED_BODIES = None

# --- how parameters go ---------------------------------------------------------------


def queue_params(queues: Sequence[str] | None, limits: Mapping[str, int]) -> dict:
    """CLAIM's queues (None: every queue) as a JSON list, its limits as a JSON object."""
    return {
        "queues": json.dumps(list(queues)) if queues else None,
        "caps": json.dumps(dict(limits)),
    }


def workflow_params(workflows: Sequence[str] | None, prefixes: Sequence[str]) -> dict:
    """CLAIM's workflows (None: any) and name prefixes, as JSON lists."""
    return {
        "workflows": None if workflows is None else json.dumps(list(workflows)),
        "prefixes": json.dumps(list(prefixes)),
    }


def sets_claim_level(connection) -> bool:
    """Never: SQLite has no level to set (CLAIM_LEVEL)."""
    return False


def lease_params(at: datetime, lease: timedelta) -> dict:
    """CLAIM's clock and lease end: this process's clock."""
    return {"now": at, "lease_expires_at": at + lease}


def flow_params(limits: Mapping[str, Any], at: datetime, connection) -> dict:
    """CLAIM's flow limits (``limits``: workflow -> store.flow.FlowLimit) as one JSON
    object of workflow -> [key_cap, cap, rate, window start], the window's start (now
    less ``per``, this process's clock) in the form SQLite stores times."""
    adapt = connection.ops.adapt_datetimefield_value
    return {
        "flow": json.dumps(
            {
                n: [
                    limit.key_cap,
                    limit.cap,
                    limit.rate,
                    adapt(at - limit.per) if limit.per is not None else None,
                ]
                for n, limit in sorted(limits.items())
            }
        )
    }
