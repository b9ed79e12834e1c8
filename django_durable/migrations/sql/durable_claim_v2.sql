-- durable_claim_v2: a worker's claim of up to p_limit due runs, in one statement,
-- with flow control by key (docs/flow-control.md). Created by migration 0003; never
-- edited: a change is a durable_claim_v3 beside it, in a new migration
-- (docs/production.md, "Upgrading"). durable_claim_v1 stays beside it for the
-- previous release's workers during a rolling deploy (they claim without flow limits
-- or turns, as before).
--
-- Arguments: those of durable_claim_v1, then the flow limits of the workflows the
-- worker serves that have any (store/flow.py): p_flow_workflows, and per workflow
-- p_key_caps (concurrency_per_key), p_flow_caps (concurrency), p_rates and p_pers
-- (rate_per_key's limit and window), NULL where the workflow has no such limit.
--
-- Two paths. When no claimable run of the served queues has a flow key, and no
-- claimable run belongs to a workflow with a workflow-wide limit, the claim is
-- durable_claim_v1's statement, unchanged (the same plan through durable_run_claim):
-- the probe that decides is one look into durable_run_flow, which holds only runs
-- with a flow key (and, with a workflow-wide limit, one into
-- durable_run_workflow_status). A project that uses no flow key pays that probe and
-- nothing else.
--
-- Otherwise (the flow path):
-- 1. The claimers of limited workflows serialise on one transaction-level advisory
--    lock per limited workflow, taken in name order, released at commit. Each later
--    statement of this (volatile) function takes a new snapshot, so the claim below
--    counts what the previous holder of the lock claimed and committed: the limits
--    are exact across workers and threads. Counting in a statement that waited for a
--    row lock would not do (READ COMMITTED: its snapshot predates the wait).
-- 2. v_now, the database's clock read after the lock: the due time, the lease and a
--    run's begin (started_at) are all judged by it, never by a worker's clock, and it
--    grows from one holder of the lock to the next (the rate's window is exact).
-- 3. The claim: per open queue, the distinct (flow key, workflow) pairs of its
--    claimable runs, found by a loose index scan of durable_run_flow (one probe per
--    pair, however many runs a key has waiting); per pair the room its limits leave
--    (concurrency_per_key less its running runs, concurrency less the workflow's,
--    the rate's limit less its begins since v_now - per, counted through
--    durable_run_flow_begun: at most `limit` index entries), then up to that room of
--    its due runs, in claim order, locked FOR UPDATE SKIP LOCKED. Runs without a flow
--    key are one more group per queue, read through durable_run_claim_no_flow (not
--    durable_run_claim: there they sit among a key's backlog, which reading for the
--    first of them would walk, or the planner would scan the table for). The
--    candidates are then taken in turns: priority first, then round by round across
--    flow keys (the first due run of every key, then the second...), within a round
--    the key whose turn (durable_flow_turn.claimed_at) is oldest first, a key never
--    claimed from before first of all. The running runs counted are those a worker
--    holds (status running or compensating with a lease), as for a queue's limit: a
--    dead worker's run counts until its lease runs out and recovery returns it.
-- 4. The picked runs are claimed, as by v1, and each picked (queue, flow key) gets
--    its turn (an upsert in key order: two claimers never wait on each other in a
--    cycle).
-- The window functions run over the candidates only (at most p_limit per pair). A
-- filter of step 3 that drops a run never lets another past a limit: it can only
-- leave the claim with fewer runs, which the worker's next claim takes.
--
-- A function keeps the plan of its statements for the database session; "jit = off"
-- as for v1.
CREATE OR REPLACE FUNCTION durable_claim_v2(
    p_queues text[], p_limit integer, p_limited text[], p_caps integer[],
    p_workflows text[], p_prefixes text[], p_worker varchar, p_lease interval,
    p_flow_workflows text[], p_key_caps integer[], p_flow_caps integer[],
    p_rates integer[], p_pers interval[]
) RETURNS SETOF durable_run
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $claim$
DECLARE
    v_flow boolean := false;
    v_now timestamptz;
BEGIN
    -- Is there a claimable run with a flow key in the served queues?
    SELECT EXISTS (
        SELECT 1 FROM durable_run
        WHERE flow_key IS NOT NULL
          AND status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
          AND (p_queues::text[] IS NULL OR queue = ANY (p_queues::text[]))
    ) INTO v_flow;
    -- Or one of a workflow with a workflow-wide limit?
    IF NOT v_flow
       AND EXISTS (SELECT 1 FROM unnest(p_flow_caps::integer[]) AS cap WHERE cap IS NOT NULL) THEN
        SELECT EXISTS (
            SELECT 1 FROM durable_run
            WHERE workflow = ANY (ARRAY(
                    SELECT l.workflow
                    FROM unnest(p_flow_workflows::text[], p_flow_caps::integer[]) AS l(workflow, cap)
                    WHERE l.cap IS NOT NULL))
              AND status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
        ) INTO v_flow;
    END IF;
    IF NOT v_flow THEN
        RETURN QUERY
WITH RECURSIVE served(name) AS (
    (SELECT unnest(p_queues::text[]) AS name)
    UNION ALL
    (SELECT queue FROM durable_run
     WHERE p_queues::text[] IS NULL
       AND status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
     ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT queue FROM durable_run
            WHERE status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
              AND queue > served.name
            ORDER BY queue LIMIT 1)
    FROM served
    WHERE p_queues::text[] IS NULL AND served.name IS NOT NULL
),
open_queues AS (
    SELECT served.name,
           CASE WHEN lim.cap IS NULL THEN p_limit
                ELSE GREATEST(lim.cap - (
                    SELECT count(*) FROM durable_run AS held
                    WHERE held.queue = served.name
                      AND held.status IN ('running', 'compensating')
                      AND held.lease_expires_at IS NOT NULL), 0)
           END AS room
    FROM served
    LEFT JOIN unnest(p_limited::text[], p_caps::integer[]) AS lim(name, cap)
           ON lim.name = served.name
    WHERE served.name IS NOT NULL
      AND NOT COALESCE((SELECT q.paused FROM durable_queue AS q WHERE q.name = served.name),
                       false)
),
picked AS MATERIALIZED (
    SELECT p.id, p.priority, p.due_at
    FROM open_queues
    CROSS JOIN LATERAL (
        SELECT id, priority, due_at FROM durable_run
        WHERE queue = open_queues.name
          AND status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
          AND due_at <= statement_timestamp()
          AND (p_workflows::text[] IS NULL OR workflow = ANY (p_workflows::text[])
               OR workflow LIKE ANY (p_prefixes::text[]))
        ORDER BY priority DESC, due_at
        LIMIT LEAST(open_queues.room, p_limit)
        FOR UPDATE SKIP LOCKED
    ) AS p
    ORDER BY p.priority DESC, p.due_at
    LIMIT p_limit
)
UPDATE durable_run SET
    status = CASE WHEN status = 'compensating' THEN 'compensating' ELSE 'running' END,
    due_at = CASE WHEN status = 'compensating' THEN NULL ELSE durable_run.due_at END,
    worker_id = p_worker,
    lease_expires_at = statement_timestamp() + p_lease,
    fence = fence + 1,
    started_at = COALESCE(started_at, statement_timestamp())
WHERE durable_run.id = ANY (ARRAY(SELECT id FROM picked))
RETURNING durable_run.*;
        RETURN;
    END IF;

    -- 1. Serialise the claimers of the limited workflows (in name order).
    PERFORM count(pg_advisory_xact_lock(hashtextextended('django_durable.flow:' || name, 0)))
    FROM (SELECT name FROM unnest(p_flow_workflows::text[]) AS name ORDER BY name) AS limited;
    -- 2. The database's clock, after the lock.
    v_now := clock_timestamp();
    -- 3 and 4.
    RETURN QUERY
WITH RECURSIVE served(name) AS (
    (SELECT unnest(p_queues::text[]) AS name)
    UNION ALL
    (SELECT queue FROM durable_run
     WHERE p_queues::text[] IS NULL
       AND status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
     ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT queue FROM durable_run
            WHERE status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
              AND queue > served.name
            ORDER BY queue LIMIT 1)
    FROM served
    WHERE p_queues::text[] IS NULL AND served.name IS NOT NULL
),
open_queues AS (
    SELECT served.name,
           CASE WHEN lim.cap IS NULL THEN p_limit
                ELSE GREATEST(lim.cap - (
                    SELECT count(*) FROM durable_run AS held
                    WHERE held.queue = served.name
                      AND held.status IN ('running', 'compensating')
                      AND held.lease_expires_at IS NOT NULL), 0)
           END AS room
    FROM served
    LEFT JOIN unnest(p_limited::text[], p_caps::integer[]) AS lim(name, cap)
           ON lim.name = served.name
    WHERE served.name IS NOT NULL
      AND NOT COALESCE((SELECT q.paused FROM durable_queue AS q WHERE q.name = served.name),
                       false)
),
-- The flow limits, one row per limited workflow.
limits AS (
    SELECT * FROM unnest(p_flow_workflows::text[], p_key_caps::integer[],
                         p_flow_caps::integer[], p_rates::integer[], p_pers::interval[])
        AS l(workflow, key_cap, cap, rate, per)
),
-- The runs of the limited workflows a worker holds, per flow key.
busy AS (
    SELECT held.workflow, held.flow_key, count(*) AS n
    FROM durable_run AS held
    WHERE held.workflow = ANY (p_flow_workflows::text[])
      AND held.status IN ('running', 'compensating') AND held.lease_expires_at IS NOT NULL
    GROUP BY held.workflow, held.flow_key
),
-- A limited workflow's room under its workflow-wide limit (NULL: none).
workflow_room AS (
    SELECT limits.workflow,
           limits.cap - COALESCE((SELECT sum(busy.n) FROM busy
                                  WHERE busy.workflow = limits.workflow), 0) AS room
    FROM limits
),
-- The (flow key, workflow) pairs of each open queue's claimable runs: a loose index
-- scan of durable_run_flow, one probe per pair.
pairs(queue, flow_key, workflow) AS (
    SELECT open_queues.name, first.flow_key, first.workflow
    FROM open_queues
    CROSS JOIN LATERAL (
        SELECT r.flow_key, r.workflow FROM durable_run AS r
        WHERE r.queue = open_queues.name AND r.flow_key IS NOT NULL
          AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
        ORDER BY r.flow_key, r.workflow LIMIT 1
    ) AS first
    UNION ALL
    SELECT pairs.queue, next.flow_key, next.workflow
    FROM pairs
    CROSS JOIN LATERAL (
        SELECT r.flow_key, r.workflow FROM durable_run AS r
        WHERE r.queue = pairs.queue AND r.flow_key IS NOT NULL
          AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
          AND (r.flow_key, r.workflow) > (pairs.flow_key, pairs.workflow)
        ORDER BY r.flow_key, r.workflow LIMIT 1
    ) AS next
),
-- Each pair's room: its queue's, its key's (concurrency_per_key), its workflow's
-- (concurrency), and how many may still begin (rate_per_key; NULL: no rate).
slots AS (
    SELECT pairs.queue, pairs.flow_key, pairs.workflow,
           limits.key_cap - COALESCE(busy.n, 0) AS key_room,
           LEAST(open_queues.room, p_limit,
                 COALESCE(limits.key_cap - COALESCE(busy.n, 0), p_limit),
                 COALESCE(workflow_room.room, p_limit)) AS room,
           CASE WHEN limits.rate IS NOT NULL THEN limits.rate - (
               SELECT count(*) FROM durable_run AS begun
               WHERE begun.workflow = pairs.workflow AND begun.flow_key = pairs.flow_key
                 AND begun.started_at IS NOT NULL AND begun.started_at > v_now - limits.per)
           END AS begins
    FROM pairs
    JOIN open_queues ON open_queues.name = pairs.queue
    LEFT JOIN limits ON limits.workflow = pairs.workflow
    LEFT JOIN busy ON busy.workflow = pairs.workflow AND busy.flow_key = pairs.flow_key
    LEFT JOIN workflow_room ON workflow_room.workflow = pairs.workflow
    WHERE p_workflows::text[] IS NULL OR pairs.workflow = ANY (p_workflows::text[])
       OR pairs.workflow LIKE ANY (p_prefixes::text[])
),
-- Up to its room of each pair's due runs, and of the runs without a flow key of each
-- open queue (but none of a workflow at its workflow-wide limit), locked.
candidates AS MATERIALIZED (
    SELECT c.id, c.queue, c.flow_key, c.workflow, c.priority, c.due_at, c.started_at,
           slots.key_room, slots.begins
    FROM slots
    CROSS JOIN LATERAL (
        SELECT r.id, r.queue, r.flow_key, r.workflow, r.priority, r.due_at, r.started_at
        FROM durable_run AS r
        WHERE r.queue = slots.queue AND r.flow_key = slots.flow_key
          AND r.workflow = slots.workflow
          AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
          AND r.due_at <= v_now
        -- The pair's runs in claim order (priority, then due, then id), spelled as
        -- durable_run_flow holds them: the id is an order durable_run_claim cannot
        -- give, so even the generic plan of a key holding nearly every run reads
        -- durable_run_flow, never durable_run_claim (where another key's runs sit
        -- behind the whole backlog: a claim of 0.8 s at 1M runs of one key).
        ORDER BY r.flow_key, r.workflow, r.priority DESC, r.due_at, r.id
        LIMIT GREATEST(slots.room, 0)
        FOR UPDATE SKIP LOCKED
    ) AS c
    UNION ALL
    SELECT c.id, c.queue, NULL, c.workflow, c.priority, c.due_at, c.started_at, NULL, NULL
    FROM open_queues
    CROSS JOIN LATERAL (
        SELECT r.id, r.queue, r.workflow, r.priority, r.due_at, r.started_at
        FROM durable_run AS r
        WHERE r.queue = open_queues.name AND r.flow_key IS NULL
          AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
          AND r.due_at <= v_now
          AND (p_workflows::text[] IS NULL OR r.workflow = ANY (p_workflows::text[])
               OR r.workflow LIKE ANY (p_prefixes::text[]))
          AND NOT EXISTS (SELECT 1 FROM workflow_room AS full_
                          WHERE full_.workflow = r.workflow AND full_.room <= 0)
        ORDER BY r.priority DESC, r.due_at
        LIMIT LEAST(open_queues.room, p_limit)
        FOR UPDATE SKIP LOCKED
    ) AS c
),
-- Each candidate's round within its (queue, flow key), its key's last turn, and
-- its place among its key's first claims (for the rate).
ranked AS (
    SELECT candidates.*, turns.claimed_at AS turn_at,
           row_number() OVER (PARTITION BY candidates.queue, candidates.flow_key
                              ORDER BY candidates.priority DESC, candidates.due_at) AS round,
           row_number() OVER (PARTITION BY candidates.workflow, candidates.flow_key,
                                           candidates.started_at IS NULL
                              ORDER BY candidates.priority DESC, candidates.due_at) AS begin_n
    FROM candidates
    LEFT JOIN durable_flow_turn AS turns
           ON turns.queue = candidates.queue
          AND turns.flow_key = COALESCE(candidates.flow_key, '')
),
-- In turns, with the rate's room applied (a resumed run does not begin again).
fair AS (
    SELECT ranked.*,
           row_number() OVER (PARTITION BY ranked.queue
                              ORDER BY ranked.priority DESC, ranked.round,
                                       ranked.turn_at NULLS FIRST, ranked.due_at) AS queue_n,
           row_number() OVER (PARTITION BY ranked.workflow
                              ORDER BY ranked.priority DESC, ranked.round,
                                       ranked.turn_at NULLS FIRST, ranked.due_at) AS workflow_n,
           row_number() OVER (PARTITION BY ranked.workflow, ranked.flow_key
                              ORDER BY ranked.priority DESC, ranked.due_at) AS key_n
    FROM ranked
    WHERE ranked.begins IS NULL OR ranked.started_at IS NOT NULL
       OR ranked.begin_n <= ranked.begins
),
picked AS (
    SELECT fair.id, fair.queue, fair.flow_key
    FROM fair
    JOIN open_queues ON open_queues.name = fair.queue
    LEFT JOIN workflow_room ON workflow_room.workflow = fair.workflow
    WHERE fair.queue_n <= open_queues.room
      AND (workflow_room.room IS NULL OR fair.workflow_n <= workflow_room.room)
      AND (fair.key_room IS NULL OR fair.key_n <= fair.key_room)
    ORDER BY fair.priority DESC, fair.round, fair.turn_at NULLS FIRST, fair.due_at
    LIMIT p_limit
),
turned AS (
    INSERT INTO durable_flow_turn AS turn (queue, flow_key, claimed_at)
    SELECT DISTINCT picked.queue, COALESCE(picked.flow_key, ''), v_now
    FROM picked
    ORDER BY 1, 2
    ON CONFLICT (queue, flow_key) DO UPDATE SET claimed_at = EXCLUDED.claimed_at
)
UPDATE durable_run SET
    status = CASE WHEN status = 'compensating' THEN 'compensating' ELSE 'running' END,
    due_at = CASE WHEN status = 'compensating' THEN NULL ELSE durable_run.due_at END,
    worker_id = p_worker,
    lease_expires_at = v_now + p_lease,
    fence = fence + 1,
    started_at = COALESCE(started_at, v_now)
WHERE durable_run.id = ANY (ARRAY(SELECT id FROM picked))
RETURNING durable_run.*;
END
$claim$;
