"""The PostgreSQL engine: every statement django-durable runs on PostgreSQL, in one
place (Procrastinate's ``sql/queries.sql``; Oban's ``Oban.Engines.Basic``).

Each statement is one literal with a comment above it: what it does, and which
index serves it. The store's modules ask ``store.base.engine()`` for the engine of
their connection and run its statements; none of them asks which database it is.
A statement this engine lacks is ``None`` in the other engine (``sqlite.py``), with
a comment saying what the store does there instead.

The hot statements (a start, a claim, its next-due look-up, a step's record) call
the store's PL/pgSQL functions (``store/functions.py`` says why); their text lives
in ``django_durable/migrations/sql/<name>_v<N>.sql``, frozen, and the calls here
name the version this code uses (``functions.CURRENT``).

The claimable statuses appear in several statements as the claim index
``durable_run_claim`` spells its condition (``status IN ('pending', 'waiting',
'compensating') AND due_at IS NOT NULL``, from ``models.CLAIMABLE_STATUSES``): a
statement must repeat a partial index's condition literally for the planner to use
the index, so it cannot be a parameter or a piece glued on at import;
tests/test_engines.py checks each spelling against the model's index.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

# The engine's name: the vendor it serves (Django's ``connection.vendor``).
NAME = "postgresql"

# --- what this database does ------------------------------------------------------

# Leases, heartbeats, due times and recoveries are judged by the database's clock
# (store.base: ``now()`` corrects this process's clock by its measured offset).
SERVER_CLOCK = True
# Writers take row locks and run side by side (a worker's threads really run at once).
SERIALISES_WRITERS = False
# LISTEN/NOTIFY wakes idle workers (they poll as well).
LISTENS = True
# A batch of starts (``start_many``) and of last steps' records (the worker's
# recorder) is one statement each (START_BATCH, RECORD_LAST_STEPS).
BATCHES = True
# A claimed row's values are converted by the fields (``from_db_value``), so a raw
# row becomes a Run without the backend's converters (store.base.from_row).
ROWS_NEED_BACKEND_CONVERTERS = False

# --- the clock and waking workers ---------------------------------------------------

# The database's clock now (clock_timestamp(), not the transaction's start): the
# clock offset measured when a connection opens, and doctor's clock. No table.
READ_CLOCK = "SELECT clock_timestamp()"

# Wakes the idle workers that LISTEN on channel %s for queue %s; delivered when the
# transaction commits. No table.
NOTIFY = "SELECT pg_notify(%s, %s)"

# LISTEN on a channel, on a worker's dedicated connection; the channel is quoted as
# an identifier by the backend's own quoting (``ops.quote_name``), then put in the
# braces: an identifier cannot be a parameter. No table.
LISTEN = "LISTEN {channel}"

# --- starting runs -------------------------------------------------------------------

# Insert a run unless its key is taken (``durable_run_one_holder_per_key``, the
# unique index on (workflow, key) of the key holders, arbitrates: a taken key is no
# row back, never an error). Every column of durable_run is named (tests check them
# against the model, ``store.base.RUN_COLUMNS``). A run waiting behind a key
# (``run_again``), and SQLite's start.
INSERT_RUN = """
INSERT INTO durable_run (
    id, workflow, queue, status, priority, input, context, result, error, "key",
    holds_key, runs_after_id, parent_id, step_index, attempt, due_at, timeout_at,
    debounce_deadline, waiting_for, state, worker_id, lease_expires_at, fence,
    recoveries, step_names, trace_context, created_at, started_at, finished_at,
    rerun_of_id, rerun_from_step, inputs, flow_key, flow_slot, workflow_slot, queue_slot
) VALUES (
    %(id)s, %(workflow)s, %(queue)s, %(status)s, %(priority)s, %(input)s, %(context)s,
    %(result)s, %(error)s, %(key)s, %(holds_key)s, %(runs_after_id)s, %(parent_id)s,
    %(step_index)s, %(attempt)s, %(due_at)s, %(timeout_at)s, %(debounce_deadline)s,
    %(waiting_for)s, %(state)s, %(worker_id)s, %(lease_expires_at)s, %(fence)s,
    %(recoveries)s, %(step_names)s, %(trace_context)s, %(created_at)s, %(started_at)s,
    %(finished_at)s, %(rerun_of_id)s, %(rerun_from_step)s, %(inputs)s, %(flow_key)s,
    %(flow_slot)s, %(workflow_slot)s, %(queue_slot)s
)
ON CONFLICT DO NOTHING
RETURNING id
"""

# A start in one round trip whether the key is free or taken: a call of
# durable_start_v2 (its .sql file says what it does: the insert arbitrated by
# durable_run_one_holder_per_key, the holder read through the same index, the
# duplicate's activity row, the NOTIFY). The run's columns (starts.START_COLUMNS),
# then the NOTIFY's and the duplicate note's, in the order of its parameters (a test
# compares them). The arguments carry no casts: the function has one signature, so
# PostgreSQL reads each quoted argument as its parameter's type (starts._start_params).
START = """
SELECT durable_start_v2(
    %(id)s, %(workflow)s, %(queue)s, %(priority)s, %(input)s, %(context)s, %(key)s,
    %(holds_key)s, %(runs_after_id)s, %(parent_id)s, %(due_at)s, %(timeout_at)s,
    %(debounce_deadline)s, %(step_names)s, %(trace_context)s, %(created_at)s, %(flow_key)s,
    %(wake)s, %(channel)s, %(outcome)s, %(answers)s
)
"""

# Hand a finished holder's key to a new run, all or nothing, in one statement:
# ``released`` lets the key go if the holder still holds it in the status the start
# saw (found by its primary key: "holds_key IS NOT FALSE" matches no partial index of
# holders, which stale statistics once made the planner scan whole); ``new`` inserts
# the run only if that happened (the released version no longer counts for
# durable_run_one_holder_per_key within the statement); ``noted`` records the
# hand-off; and the NOTIFY wakes a worker. Every column of durable_run is named.
HAND_OFF = """
WITH released AS (
    UPDATE durable_run SET holds_key = false
    WHERE id = %(holder_id)s AND holds_key IS NOT FALSE AND status = %(holder_status)s
    RETURNING id
),
new AS (
    INSERT INTO durable_run (
        id, workflow, queue, status, priority, input, context, result, error, "key",
        holds_key, runs_after_id, parent_id, step_index, attempt, due_at,
        timeout_at, debounce_deadline, waiting_for, state, worker_id,
        lease_expires_at, fence, recoveries, step_names, trace_context, created_at,
        started_at, finished_at, rerun_of_id, rerun_from_step, inputs, flow_key,
        flow_slot, workflow_slot, queue_slot
    )
    SELECT
        %(id)s::uuid, %(workflow)s::varchar, %(queue)s::varchar, %(status)s::varchar,
        %(priority)s::integer, %(input)s::jsonb, %(context)s::jsonb, %(result)s::jsonb,
        %(error)s::jsonb, %(key)s::varchar, %(holds_key)s::boolean, %(runs_after_id)s::uuid,
        %(parent_id)s::uuid, %(step_index)s::integer, %(attempt)s::integer,
        %(due_at)s::timestamptz, %(timeout_at)s::timestamptz,
        %(debounce_deadline)s::timestamptz, %(waiting_for)s::varchar, %(state)s::jsonb,
        %(worker_id)s::varchar, %(lease_expires_at)s::timestamptz, %(fence)s::integer,
        %(recoveries)s::integer, %(step_names)s::jsonb, %(trace_context)s::jsonb,
        %(created_at)s::timestamptz, %(started_at)s::timestamptz,
        %(finished_at)s::timestamptz, %(rerun_of_id)s::uuid, %(rerun_from_step)s::varchar,
        %(inputs)s::jsonb, %(flow_key)s::varchar, %(flow_slot)s::smallint,
        %(workflow_slot)s::smallint, %(queue_slot)s::smallint
    WHERE EXISTS (SELECT 1 FROM released)
    RETURNING id
),
noted AS (
    INSERT INTO durable_activity (kind, run_id, workflow, "key", details, created_at)
    SELECT 'key_handed_off', new.id, %(workflow)s, %(key)s, %(details)s::jsonb, %(created_at)s
    FROM new
    RETURNING 1
)
SELECT CASE WHEN %(wake)s THEN pg_notify(%(channel)s, %(queue)s)::text IS NULL ELSE false END,
       EXISTS (SELECT 1 FROM noted)
FROM new
"""

# A batch of new runs of one workflow (``start_many``) that share their queue,
# priority and due time, in one statement: the items come in as arrays (``unnest``),
# each keeps its place (``ord``), ``ON CONFLICT DO NOTHING`` leaves a taken key to
# its holder, and the holder of each taken key is read through
# durable_run_one_holder_per_key (one probe per taken key), with the statement's
# snapshot. ``wake`` sends one NOTIFY for the batch when its runs are due now (at
# commit). Every column of durable_run is named. One row per item, in order.
START_BATCH = """
WITH item AS (
    SELECT *
    FROM unnest(%(ids)s::uuid[], %(inputs)s::jsonb[], %(keys)s::text[], %(flow_keys)s::text[])
         WITH ORDINALITY AS i(id, input, "key", flow_key, ord)
),
new AS (
    INSERT INTO durable_run (
        id, workflow, queue, status, priority, input, context, result, error, "key",
        holds_key, runs_after_id, parent_id, step_index, attempt, due_at, timeout_at,
        debounce_deadline, waiting_for, state, worker_id, lease_expires_at, fence,
        recoveries, step_names, trace_context, created_at, started_at, finished_at,
        rerun_of_id, rerun_from_step, inputs, flow_key, flow_slot, workflow_slot, queue_slot
    )
    SELECT item.id, %(workflow)s, %(queue)s, 'pending', %(priority)s, item.input,
           '{}'::jsonb, NULL, NULL, item.key, item.key IS NOT NULL, NULL, NULL, 0, 1,
           %(due_at)s::timestamptz, %(timeout_at)s::timestamptz, NULL, NULL, '{}'::jsonb,
           NULL, NULL, 0, 0, %(step_names)s::jsonb, %(trace_context)s::jsonb,
           %(created_at)s::timestamptz, NULL, NULL, NULL, NULL, NULL, item.flow_key,
           NULL, NULL, NULL
    FROM item
    ORDER BY item.ord
    ON CONFLICT DO NOTHING
    RETURNING id
),
wake AS (
    SELECT pg_notify(%(channel)s, %(queue)s) FROM (SELECT 1 FROM new LIMIT 1) AS any_new
    WHERE %(wake)s
)
SELECT item.ord, new.id IS NOT NULL, holder.id, holder.status, holder.started_at,
       holder.input IS DISTINCT FROM item.input,
       (SELECT count(*) FROM wake)
FROM item
LEFT JOIN new ON new.id = item.id
LEFT JOIN durable_run AS holder
       ON new.id IS NULL AND item.key IS NOT NULL
      AND holder.workflow = %(workflow)s AND holder.key = item.key AND holder.holds_key
ORDER BY item.ord
"""

# --- claiming ------------------------------------------------------------------------

# The claim's transaction at READ COMMITTED whatever its session's level: the first
# statement of the claim's transaction when the session is at another level (the
# alias's OPTIONS["isolation_level"] or the server's default: sets_claim_level), so
# that the claim's counts, made after its locks, see the claims committed before them
# (durable_claim_v6; at any level the slot indexes refuse a run past a limit, this
# makes the refusal rare). No table.
CLAIM_LEVEL = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"

# Claim up to %(limit)s due runs in one statement: a call of durable_claim_v6 (its
# .sql file says how: the queues served and their room, the runs picked through
# durable_run_claim with FOR UPDATE SKIP LOCKED; with flow-keyed runs or runs of a
# workflow-wide limit due, the keys in turns through durable_run_flow and
# durable_flow_turn, each limited scope's room counted after its lock, and each
# claimed run's slots under the unique indexes durable_run_queue_slot,
# durable_run_workflow_slot, durable_run_flow_slot and durable_flow_rate_slot_key;
# the flow parameters are flow_params'). The claimed runs' columns, named in the
# model's order (``store.base.RUN_ATTNAMES``; a test compares them): the function
# returns this explicit list, so a column added later does not change its result.
CLAIM = """
SELECT id, workflow, queue, status, priority, input, context, result, error, "key",
    holds_key, runs_after_id, parent_id, step_index, attempt, due_at, timeout_at,
    debounce_deadline, waiting_for, state, worker_id, lease_expires_at, fence,
    recoveries, step_names, trace_context, created_at, started_at, finished_at,
    rerun_of_id, rerun_from_step, inputs, flow_key, flow_slot, workflow_slot, queue_slot
FROM durable_claim_v6(
    %(queues)s::text[], %(limit)s::integer, %(limited)s::text[], %(caps)s::integer[],
    %(workflows)s::text[], %(prefixes)s::text[], %(worker_id)s::varchar, %(lease)s::interval,
    %(flow_workflows)s::text[], %(key_caps)s::integer[], %(flow_caps)s::integer[],
    %(rates)s::integer[], %(pers)s::interval[]
)
"""

# durable_claim_v6 gives the claimed runs' slots in its statement.
CLAIM_GIVES_SLOTS = True

# None: durable_claim_v6 records the turns it gave in the claim's statement.
TAKE_TURNS = None

# When the next claimable run of the open queues is due, for an idle worker's wait:
# a call of durable_next_due_at_v1 (its .sql file says how: durable_run_claim, a
# probe per queue and priority level).
NEXT_DUE_AT = """
SELECT durable_next_due_at_v1(
    %(queues)s::text[], %(limit)s::integer, %(limited)s::text[], %(caps)s::integer[]
)
"""

# Due runs per queue, each count capped at %(cap)s, for the queue depth gauge; reads
# durable_run_claim only. ``queues`` skips through the index queue by queue (a loose
# index scan: one probe per queue), ``levels`` through each queue's priority levels
# the same way (as durable_next_due_at_v1 reads them); per (queue, priority) the due
# entries are an index range (due_at <= statement_timestamp(), the claim's clock).
QUEUE_DEPTH = """
WITH RECURSIVE queues(name) AS (
    (SELECT queue FROM durable_run
     WHERE status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
     ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT queue FROM durable_run
            WHERE status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
              AND queue > queues.name
            ORDER BY queue LIMIT 1)
    FROM queues
    WHERE queues.name IS NOT NULL
)
SELECT queues.name, LEAST(%(cap)s, (
    WITH RECURSIVE levels(priority) AS (
        (SELECT priority FROM durable_run
         WHERE queue = queues.name
           AND status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
         ORDER BY priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT priority FROM durable_run
                WHERE queue = queues.name
                  AND status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
                  AND priority < levels.priority
                ORDER BY priority DESC LIMIT 1)
        FROM levels
        WHERE levels.priority IS NOT NULL
    )
    SELECT COALESCE(sum((
        SELECT count(*) FROM (
            SELECT 1 FROM durable_run
            WHERE queue = queues.name AND priority = levels.priority
              AND status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
              AND due_at <= statement_timestamp()
            LIMIT %(cap)s
        ) AS due)), 0)
    FROM levels
    WHERE levels.priority IS NOT NULL
))
FROM queues
WHERE queues.name IS NOT NULL
"""

# Move every planned time of the claimable runs (pending, waiting, compensating)
# earlier by the span from the database's clock to %(to)s, so what was due at
# %(to)s is due now: one UPDATE, by the clock CLAIM reads (statement_timestamp());
# a NULL stays NULL, and a %(to)s that is not in the future moves nothing. Running
# runs are left alone (a lease is not a timer). Tests only (``testing.drain``): it
# reads every claimable run, and no index serves "all of them".
ADVANCE_TIMERS = """
UPDATE durable_run SET
    due_at = due_at - shift.span,
    timeout_at = timeout_at - shift.span,
    debounce_deadline = debounce_deadline - shift.span
FROM (SELECT %(to)s::timestamptz - statement_timestamp() AS span) AS shift
WHERE durable_run.status IN ('pending', 'waiting', 'compensating')
  AND shift.span > interval '0'
"""

# --- recording steps -----------------------------------------------------------------

# A step's record as one function call, atomic on its own: the fenced UPDATE of the
# run (by its primary key, fence and status), then its attempt's row when the run is
# still this worker's, with what the step replaced in the context (durable_record_step_v2's
# .sql file). Returns the attempt's id, or NULL: the run is not this worker's.
RECORD_STEP = """
SELECT durable_record_step_v2(
    %(change)s::text, %(run_id)s::uuid, %(fence)s::integer, %(step_index)s::integer,
    %(context)s::jsonb, %(state)s::jsonb, %(due_at)s::timestamptz, %(step)s::varchar,
    %(attempt)s::integer, %(outcome)s::varchar, %(output)s::jsonb, %(error)s::jsonb,
    %(logs)s::jsonb, %(worker_id)s::varchar, %(started_at)s::timestamptz,
    %(finished_at)s::timestamptz, %(replaced)s::jsonb
)
"""

# The last steps of several runs completed (a worker's batch of completions) in one
# statement: each run completed as durable_record_step's 'last' completes it, fenced
# per run (a run whose fence moved, or that is no longer running, is left alone), and
# the attempt's row of each run completed; ``done`` lists the batch, one row per run,
# from parallel arrays. The runs are found through their primary key or
# durable_run_lease (the index of running runs, as small as the number of runs being
# executed). Returns (run id, attempt id) per run completed.
RECORD_LAST_STEPS = """
WITH done AS (
    SELECT *
    FROM unnest(
        %(run_ids)s::uuid[], %(fences)s::integer[], %(step_indexes)s::integer[],
        %(contexts)s::jsonb[], %(states)s::jsonb[], %(outputs)s::jsonb[],
        %(steps)s::varchar[], %(attempts)s::integer[], %(logs)s::jsonb[],
        %(worker_ids)s::varchar[], %(started_ats)s::timestamptz[],
        %(finished_ats)s::timestamptz[], %(replaced)s::jsonb[]
    ) AS d (run_id, fence, step_index, context, state, output, step, attempt, logs,
            worker_id, started_at, finished_at, replaced)
),
completed AS (
    UPDATE durable_run AS r
    SET step_index = d.step_index + 1, attempt = 1, context = d.context,
        waiting_for = NULL, state = d.state, status = 'completed', result = d.output,
        finished_at = d.finished_at, due_at = NULL, lease_expires_at = NULL
    FROM done AS d
    WHERE r.id = d.run_id AND r.fence = d.fence AND r.status = 'running'
    RETURNING r.id
)
INSERT INTO durable_step_attempt (
    run_id, kind, step, step_index, attempt, status, output, error, logs, worker_id,
    started_at, finished_at, replaced
)
SELECT d.run_id, 'step', d.step, d.step_index, d.attempt, 'completed', d.output, NULL,
       d.logs, d.worker_id, d.started_at, d.finished_at, d.replaced
FROM done AS d JOIN completed AS c ON c.id = d.run_id
RETURNING run_id, id
"""

# --- streams (docs/streams.md) ---------------------------------------------------------

# A write, committed alone: a call of durable_stream_write_v1 (its file says what it
# does: the stream's row raised while the writer's claim holds the run, the item, a
# reset item first for a new execution of the step), planned once per session. NULLs:
# nothing written.
WRITE_STREAM = """
SELECT written_items, with_reset FROM durable_stream_write_v1(
    %(run_id)s, %(name)s, %(value)s, %(keep_latest)s, %(step)s, %(step_index)s,
    %(attempt)s, %(fence)s, %(max_items)s, %(now)s
)
"""
# The NOTIFYs of writes once they committed, several in a transaction of their own
# (the process's notices thread): the database-wide lock a NOTIFY takes at commit is
# then held around that small transaction's commit, not around a write's (writers of
# other streams would wait for it).
NOTIFY_MANY = "SELECT count(pg_notify(%s, p)) FROM unnest(%s::text[]) AS p"
# None: WRITE_STREAM raises the stream's row itself.
UPSERT_STREAM = None
# None: WRITE_STREAM inserts the items itself.
INSERT_STREAM_ITEM = None
# A reader's read: up to %(limit)s items after %(after)s, with the run's status and the
# stream's count and close (one row with no item when none is there; no row for an
# unknown run), in one statement and one snapshot: a woken reader's one round trip.
READ_STREAM = """
SELECT r.status, s.items, s.closed_at, i."offset", i.kind, i.value, i.step, i.attempt,
       i.written_at
FROM durable_run AS r
LEFT JOIN durable_stream AS s ON s.run_id = r.id AND s.name = %(name)s
LEFT JOIN (SELECT * FROM durable_stream_item
           WHERE run_id = %(run_id)s AND stream = %(name)s AND "offset" > %(after)s
           ORDER BY "offset" LIMIT %(limit)s) AS i ON true
WHERE r.id = %(run_id)s
ORDER BY i."offset"
"""
# Close a stream (its row made if nobody wrote yet), with the NOTIFY to its readers.
CLOSE_STREAM = """
WITH closed AS (
    INSERT INTO durable_stream AS s (run_id, name, items, reset, closed_at, updated_at)
    VALUES (%(run_id)s, %(name)s, 0, false, %(now)s, %(now)s)
    ON CONFLICT (run_id, name) DO UPDATE SET closed_at = COALESCE(s.closed_at, EXCLUDED.closed_at)
    RETURNING s.items
)
SELECT items, pg_notify(%(channel)s, %(payload)s) FROM closed
"""

# --- maintenance -----------------------------------------------------------------------

# The advisory lock of pruning, held until the batch's transaction ends: false when
# another node holds it (that node is pruning). The key is PRUNE_LOCK_KEY. No table.
TRY_PRUNE_LOCK = "SELECT pg_try_advisory_xact_lock(%s)"

# Whether this session may write: not a standby in recovery, not read-only by
# default; asked after a step's own write was refused (SQLSTATE 25006). No table.
REFUSES_WRITES = "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'"

# --- what doctor and the dashboard ask the server ---------------------------------------

# Sessions of this database, other than this one, whose last statement was a worker's
# LISTEN on the channel (%s: the LISTEN statement); another database's workers on the
# same server listen on a channel of their own database. pg_stat_activity, a view: no
# index.
LISTENING_SESSIONS = """
SELECT count(*) FROM pg_stat_activity
WHERE query = %s AND pid <> pg_backend_pid() AND datname = current_database()
"""

# How many connections the server allows to non-superusers, and how many are open.
# pg_stat_activity, a view: no index.
CONNECTION_LIMITS = """
SELECT current_setting('max_connections')::int
       - current_setting('superuser_reserved_connections')::int,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')
"""

# The runs table's estimated row count (pg_class.reltuples, -1 for a table never
# analysed) and the sampled frequency of each common status (pg_stats), for the
# dashboard's counts that must not count: catalog rows, read by the table's oid.
STATUS_ESTIMATES = """
SELECT c.reltuples::bigint,
       s.most_common_vals::text::text[],
       s.most_common_freqs
  FROM pg_class c
  LEFT JOIN pg_stats s
    ON s.schemaname = current_schema() AND s.tablename = 'durable_run'
   AND s.attname = 'status'
 WHERE c.oid = to_regclass('durable_run')
"""

# The installed bodies of the functions named in %s (the text between their dollar
# quotes), among those the search path finds: pg_proc, by name (its index on
# proname).
INSTALLED_BODIES = """
SELECT proname, prosrc FROM pg_proc
WHERE proname = ANY (%s) AND pg_function_is_visible(oid)
"""

# --- how parameters go ---------------------------------------------------------------


def queue_params(queues: Sequence[str] | None, limits: Mapping[str, int]) -> dict:
    """CLAIM's and NEXT_DUE_AT's queues (None: every queue) and limited queues, as
    arrays."""
    return {
        "queues": list(queues) if queues else None,
        "limited": list(limits),
        "caps": list(limits.values()),
    }


def workflow_params(workflows: Sequence[str] | None, prefixes: Sequence[str]) -> dict:
    """CLAIM's workflows (None: any) and name prefixes, as arrays of LIKE patterns."""
    return {
        "workflows": None if workflows is None else list(workflows),
        "prefixes": [p.replace("%", r"\%").replace("_", r"\_") + "%" for p in prefixes],
    }


def sets_claim_level(connection) -> bool:
    """Whether the claim runs CLAIM_LEVEL first: when the level of ``connection``'s
    transactions is not READ COMMITTED, by its alias (OPTIONS["isolation_level"]),
    its psycopg connection, or else the server's default for the session (a role's or
    database's setting, or OPTIONS["options"]), asked once per connection."""
    connection.ensure_connection()
    raw = connection.connection
    level = getattr(raw, "isolation_level", None)
    if level is not None and level.name != "READ_COMMITTED":
        return True
    if raw not in _SERVER_LEVELS:  # outside a transaction: the session's default
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('transaction_isolation')")
            _SERVER_LEVELS[raw] = cursor.fetchone()[0] != "read committed"
    return _SERVER_LEVELS[raw]


# Per psycopg connection: whether the server's default level is not READ COMMITTED.
_SERVER_LEVELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def lease_params(at: datetime, lease: timedelta) -> dict:
    """CLAIM's lease: a span, added to the database's clock in the statement."""
    return {"lease": lease}


def flow_params(limits: Mapping[str, Any], at: datetime, connection) -> dict:
    """CLAIM's flow limits (``limits``: workflow -> store.flow.FlowLimit), as arrays
    in name order; the rate's window is judged by the database's clock."""
    names = sorted(limits)
    return {
        "flow_workflows": names,
        "key_caps": [limits[n].key_cap for n in names],
        "flow_caps": [limits[n].cap for n in names],
        "rates": [limits[n].rate for n in names],
        "pers": [limits[n].per for n in names],
    }
