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

# None: SQLite serialises writers, so CLAIM's count of a limited queue's room and the
# claim are one write already.
LOCK_LIMITED_QUEUES = None

# Claim up to %(limit)s due runs in one statement: the due runs of the queues in
# %(queues)s (a JSON list; NULL: every queue) that are not paused, numbered within
# their queue in claim order, of a limited queue (%(caps)s, a JSON object of queue ->
# limit) only as many as its room, of the workflows in %(workflows)s (NULL: any) or
# whose name starts with one of %(prefixes)s. The due runs are read through
# durable_run_claim (its condition repeated: a partial index is used only then), the
# room through durable_run_lease. A claimed compensating run stays compensating and
# stops being due while owned; the fence grows. Every column comes back (``*``).
CLAIM = """
UPDATE durable_run SET
    status = CASE WHEN status = 'compensating' THEN 'compensating' ELSE 'running' END,
    due_at = CASE WHEN status = 'compensating' THEN NULL ELSE due_at END,
    worker_id = %(worker_id)s,
    lease_expires_at = %(lease_expires_at)s,
    fence = fence + 1,
    started_at = COALESCE(started_at, %(now)s)
WHERE id IN (
    SELECT ranked.id FROM (
        SELECT id, queue, priority, due_at,
               ROW_NUMBER() OVER (PARTITION BY queue ORDER BY priority DESC, due_at) AS n
        FROM durable_run
        WHERE status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
          AND due_at <= %(now)s
          AND (%(queues)s IS NULL OR queue IN (SELECT value FROM json_each(%(queues)s)))
          AND queue NOT IN (SELECT name FROM durable_queue WHERE paused)
          AND (%(workflows)s IS NULL OR workflow IN (SELECT value FROM json_each(%(workflows)s))
               OR EXISTS (SELECT 1 FROM json_each(%(prefixes)s) AS p
                          WHERE substr(workflow, 1, length(p.value)) = p.value))
    ) AS ranked
    LEFT JOIN json_each(%(caps)s) AS cap ON cap.key = ranked.queue
    WHERE cap.key IS NULL OR ranked.n <= cap.value - (
        SELECT count(*) FROM durable_run AS held
        WHERE held.queue = ranked.queue AND held.status IN ('running', 'compensating')
          AND held.lease_expires_at IS NOT NULL)
    ORDER BY ranked.priority DESC, ranked.due_at
    LIMIT %(limit)s
)
RETURNING *
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


def lease_params(at: datetime, lease: timedelta) -> dict:
    """CLAIM's clock and lease end: this process's clock."""
    return {"now": at, "lease_expires_at": at + lease}
