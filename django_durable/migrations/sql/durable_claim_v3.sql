-- durable_claim_v3: a worker's claim of up to p_limit due runs, in one statement,
-- with flow control by key (docs/flow-control.md). Created by migration 0004; never
-- edited: a change is a durable_claim_v4 beside it, in a new migration
-- (docs/production.md, "Upgrading"). durable_claim_v2 and durable_claim_v1 stay
-- beside it for the previous releases' workers during a rolling deploy.
--
-- Arguments: those of durable_claim_v2 (the same call under a new name).
--
-- Two paths, chosen as by v2. When no claimable run of the served queues has a flow
-- key, and none belongs to a workflow with a workflow-wide limit, the claim is
-- durable_claim_v1's statement, unchanged.
--
-- Otherwise (the flow path). What changed from v2: v2 serialised every claimer of a
-- limited workflow on one lock, whether or not that workflow had a run due, and
-- locked up to p_limit runs of every due key to rank them, leaving most (80 row
-- locks to claim 4 runs of 20 keys). v3 claims the way SKIP LOCKED does, one level
-- up: a claimer takes the keys no other claimer is claiming from, then locks only the
-- runs it picks.
-- 1. The choices (one read, no lock): the (queue, flow key, workflow) pairs of the
--    open queues' claimable runs, by a loose index scan of durable_run_flow (one
--    probe per pair, read from the index), each with its first due run and its last
--    turn; the runs without a flow key are one more pair per queue. A pair at a limit
--    by this read's counts is left out (one whose first due run is a resumed one
--    stays at its rate: the rate counts begins only). In fair order: the highest
--    priority first, then the key whose turn (durable_flow_turn.claimed_at) is
--    oldest, a key never claimed from first of all, then the oldest due.
-- 2. The workflow locks, in name order, waiting: exclusive for a workflow with a
--    workflow-wide limit (concurrency counts every key, so its claimers take turns,
--    as in v2), shared for one with per-key limits only. Only those of the workflows
--    among the choices (and every workflow-wide one when runs without a flow key
--    are: they count towards it). The shared lock only keeps a v3 claimer out while a
--    v2 claimer, which takes it exclusive, counts during a rolling deploy.
-- 3. The keys: in fair order, the claimer tries each key's transaction-level
--    advisory lock (per workflow and flow key) without waiting, skips a key another
--    claimer holds, and stops once it holds p_limit. One that got none waits for
--    the first it skipped, so no claimer comes back empty while a run is claimable.
--    It waits for a key only when it holds none, and takes workflow locks only
--    before keys: no two claimers wait on each other in a cycle.
-- 4. v_now, the database's clock, read after the locks.
-- 5. The claim, a new statement, so a new snapshot taken after the locks: it counts
--    what the previous holder of a key's (or workflow's) lock claimed and committed,
--    which makes the limits exact across workers and threads. Per key held: the room
--    its limits leave (concurrency_per_key less its running runs, concurrency less
--    the workflow's, the rate's limit less its begins since v_now - per, counted
--    through durable_run_flow_begun), then up to that room of its due runs in claim
--    order, read without a row lock (no claimer of this release claims from a key
--    whose lock another holds). The runs without a flow key are read and locked FOR
--    UPDATE SKIP LOCKED, as by v1. The candidates are ranked as by v2: priority
--    first, then round by round across the keys (the first due run of every key,
--    then the second...), within a round the oldest turn first. Only the picked runs
--    are locked (FOR UPDATE SKIP LOCKED, their claimable state checked again: a
--    claimer of an older release may have taken one since), claimed as by v1, and
--    each picked (queue, flow key) gets its turn (an upsert in key order).
-- The running runs counted are those a worker holds (status running or compensating
-- with a lease): a dead worker's run counts until its lease runs out and recovery
-- returns it. A filter that drops a run never lets another past a limit: it can only
-- leave the claim with fewer runs, which the worker's next claim takes.
--
-- A function keeps the plan of its statements for the database session; "jit = off"
-- as for v1.
CREATE OR REPLACE FUNCTION durable_claim_v3(
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
    v_row record;
    -- The choices (step 1): (queue, flow key, workflow) with its last turn, in fair
    -- order; which of them this claimer holds (step 3), the first it skipped.
    v_queues text[];
    v_keys text[];
    v_workflows text[];
    v_turns timestamptz[];
    v_taken bigint[] := '{}';
    v_skipped integer;
    v_n integer;
BEGIN
    -- Is there a claimable run with a flow key in the served queues?
    -- In the index's order, so that even a generic plan made while nearly every run
    -- had a flow key reads durable_run_flow (v2's probe could scan the table, whose
    -- first pages hold finished runs: 1.5-2 ms a claim after 8,000 finished).
    -- (Not EXISTS: the planner drops an EXISTS's ORDER BY.)
    SELECT true INTO v_flow FROM durable_run
    WHERE flow_key IS NOT NULL
      AND status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
      AND (p_queues::text[] IS NULL OR queue = ANY (p_queues::text[]))
    ORDER BY queue, flow_key
    LIMIT 1;
    v_flow := FOUND;
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

    -- 1. The choices, in fair order (one read).
    SELECT array_agg(c.queue ORDER BY c.n), array_agg(c.flow_key ORDER BY c.n),
           array_agg(c.workflow ORDER BY c.n), array_agg(c.turn_at ORDER BY c.n)
    INTO v_queues, v_keys, v_workflows, v_turns
    FROM (
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
    SELECT served.name
    FROM served
    LEFT JOIN unnest(p_limited::text[], p_caps::integer[]) AS lim(name, cap)
           ON lim.name = served.name
    WHERE served.name IS NOT NULL
      AND NOT COALESCE((SELECT q.paused FROM durable_queue AS q WHERE q.name = served.name),
                       false)
      AND (lim.cap IS NULL OR lim.cap > (
               SELECT count(*) FROM durable_run AS held
               WHERE held.queue = served.name
                 AND held.status IN ('running', 'compensating')
                 AND held.lease_expires_at IS NOT NULL))
),
limits AS (
    SELECT * FROM unnest(p_flow_workflows::text[], p_key_caps::integer[],
                         p_flow_caps::integer[], p_rates::integer[], p_pers::interval[])
        AS l(workflow, key_cap, cap, rate, per)
),
busy AS (
    SELECT held.workflow, held.flow_key, count(*) AS n
    FROM durable_run AS held
    WHERE held.workflow = ANY (p_flow_workflows::text[])
      AND held.status IN ('running', 'compensating') AND held.lease_expires_at IS NOT NULL
    GROUP BY held.workflow, held.flow_key
),
full_workflows AS (
    SELECT limits.workflow FROM limits
    WHERE limits.cap <= COALESCE((SELECT sum(busy.n) FROM busy
                                  WHERE busy.workflow = limits.workflow), 0)
),
-- The (flow key, workflow) pairs of each open queue's claimable runs, with the
-- priority and due time of each one's first: a loose index scan of durable_run_flow,
-- one probe per pair, read from the index alone.
pairs(queue, flow_key, workflow, priority, due_at) AS (
    SELECT open_queues.name, first.flow_key, first.workflow, first.priority, first.due_at
    FROM open_queues
    CROSS JOIN LATERAL (
        SELECT r.flow_key, r.workflow, r.priority, r.due_at FROM durable_run AS r
        WHERE r.queue = open_queues.name AND r.flow_key IS NOT NULL
          AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
        ORDER BY r.flow_key, r.workflow, r.priority DESC, r.due_at LIMIT 1
    ) AS first
    UNION ALL
    SELECT pairs.queue, next.flow_key, next.workflow, next.priority, next.due_at
    FROM pairs
    CROSS JOIN LATERAL (
        SELECT r.flow_key, r.workflow, r.priority, r.due_at FROM durable_run AS r
        WHERE r.queue = pairs.queue AND r.flow_key IS NOT NULL
          AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
          AND (r.flow_key, r.workflow) > (pairs.flow_key, pairs.workflow)
        ORDER BY r.flow_key, r.workflow, r.priority DESC, r.due_at LIMIT 1
    ) AS next
),
choices AS (
    -- Each pair's first due run: its first run when that is due (nearly always),
    -- else one more probe (a later run of a lower priority may be due). A pair at a
    -- limit by this statement's counts is left out.
    SELECT pairs.queue, pairs.flow_key, pairs.workflow,
           COALESCE(late.priority, pairs.priority) AS priority,
           COALESCE(late.due_at, pairs.due_at) AS due_at,
           turns.claimed_at AS turn_at
    FROM pairs
    LEFT JOIN LATERAL (
        SELECT r.priority, r.due_at FROM durable_run AS r
        WHERE pairs.due_at > statement_timestamp()
          AND r.queue = pairs.queue AND r.flow_key = pairs.flow_key
          AND r.workflow = pairs.workflow
          AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
          AND r.due_at <= statement_timestamp()
        ORDER BY r.flow_key, r.workflow, r.priority DESC, r.due_at, r.id
        LIMIT 1
    ) AS late ON true
    LEFT JOIN limits ON limits.workflow = pairs.workflow
    LEFT JOIN busy ON busy.workflow = pairs.workflow AND busy.flow_key = pairs.flow_key
    LEFT JOIN durable_flow_turn AS turns
           ON turns.queue = pairs.queue AND turns.flow_key = pairs.flow_key
    WHERE (pairs.due_at <= statement_timestamp() OR late.due_at IS NOT NULL)
      AND (p_workflows::text[] IS NULL OR pairs.workflow = ANY (p_workflows::text[])
           OR pairs.workflow LIKE ANY (p_prefixes::text[]))
      AND pairs.workflow NOT IN (SELECT workflow FROM full_workflows)
      AND (limits.key_cap IS NULL OR limits.key_cap > COALESCE(busy.n, 0))
      -- At its rate, a key stays only when its first due run is a resumed one (the
      -- rate counts begins only).
      AND CASE WHEN limits.rate IS NULL THEN true
               WHEN limits.rate > (
                   SELECT count(*) FROM durable_run AS begun
                   WHERE begun.workflow = pairs.workflow AND begun.flow_key = pairs.flow_key
                     AND begun.started_at IS NOT NULL
                     AND begun.started_at > statement_timestamp() - limits.per) THEN true
               ELSE (SELECT r.started_at IS NOT NULL FROM durable_run AS r
                     WHERE r.queue = pairs.queue AND r.flow_key = pairs.flow_key
                       AND r.workflow = pairs.workflow
                       AND r.status IN ('pending', 'waiting', 'compensating')
                       AND r.due_at IS NOT NULL AND r.due_at <= statement_timestamp()
                     ORDER BY r.flow_key, r.workflow, r.priority DESC, r.due_at, r.id
                     LIMIT 1)
          END
    UNION ALL
    -- The runs without a flow key: one more pair per open queue.
    SELECT open_queues.name, NULL, NULL, first.priority, first.due_at,
           turns.claimed_at
    FROM open_queues
    CROSS JOIN LATERAL (
        SELECT r.priority, r.due_at FROM durable_run AS r
        WHERE r.queue = open_queues.name AND r.flow_key IS NULL
          AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
          AND r.due_at <= statement_timestamp()
          AND (p_workflows::text[] IS NULL OR r.workflow = ANY (p_workflows::text[])
               OR r.workflow LIKE ANY (p_prefixes::text[]))
          AND r.workflow NOT IN (SELECT workflow FROM full_workflows)
        ORDER BY r.priority DESC, r.due_at
        LIMIT 1
    ) AS first
    LEFT JOIN durable_flow_turn AS turns
           ON turns.queue = open_queues.name AND turns.flow_key = ''
)
SELECT choices.*,
       row_number() OVER (ORDER BY priority DESC, turn_at NULLS FIRST, due_at) AS n
FROM choices
    ) AS c;
    IF v_queues IS NULL THEN
        RETURN;  -- nothing claimable
    END IF;

    -- 2. The workflow locks, in name order: those of the limited workflows among the
    -- choices (every one with a workflow-wide limit when runs without a flow key are
    -- among them: such runs count towards it).
    FOR v_row IN
        SELECT l.workflow, l.cap
        FROM unnest(p_flow_workflows::text[], p_flow_caps::integer[]) AS l(workflow, cap)
        WHERE l.workflow = ANY (v_workflows)
           OR (l.cap IS NOT NULL AND array_position(v_keys, NULL) IS NOT NULL)
        ORDER BY l.workflow
    LOOP
        IF v_row.cap IS NOT NULL THEN
            PERFORM pg_advisory_xact_lock(
                hashtextextended('django_durable.flow:' || v_row.workflow, 0));
        ELSE
            PERFORM pg_advisory_xact_lock_shared(
                hashtextextended('django_durable.flow:' || v_row.workflow, 0));
        END IF;
    END LOOP;

    -- 3. The keys, tried in fair order without waiting, until p_limit are held; a
    -- claimer that got none waits for the first it skipped.
    FOR v_n IN 1 .. cardinality(v_queues) LOOP
        IF v_keys[v_n] IS NULL OR pg_try_advisory_xact_lock(hashtextextended(
               'django_durable.flow_key:' || length(v_workflows[v_n]) || ':'
               || v_workflows[v_n] || ':' || v_keys[v_n], 0)) THEN
            v_taken := v_taken || v_n;
            EXIT WHEN cardinality(v_taken) >= p_limit;
        ELSIF v_skipped IS NULL THEN
            v_skipped := v_n;
        END IF;
    END LOOP;
    IF cardinality(v_taken) = 0 THEN
        PERFORM pg_advisory_xact_lock(hashtextextended(
            'django_durable.flow_key:' || length(v_workflows[v_skipped]) || ':'
            || v_workflows[v_skipped] || ':' || v_keys[v_skipped], 0));
        v_taken := ARRAY[v_skipped];
    END IF;

    -- 4. The database's clock, after the locks.
    v_now := clock_timestamp();

    -- 5. The claim.
    RETURN QUERY
WITH chosen AS (
    SELECT c.queue, c.flow_key, c.workflow, c.turn_at
    FROM unnest(v_queues, v_keys, v_workflows, v_turns) WITH ORDINALITY
        AS c(queue, flow_key, workflow, turn_at, n)
    WHERE c.n = ANY (v_taken)
),
open_queues AS (
    SELECT q.name,
           CASE WHEN lim.cap IS NULL THEN p_limit
                ELSE GREATEST(lim.cap - (
                    SELECT count(*) FROM durable_run AS held
                    WHERE held.queue = q.name
                      AND held.status IN ('running', 'compensating')
                      AND held.lease_expires_at IS NOT NULL), 0)
           END AS room
    FROM (SELECT DISTINCT chosen.queue AS name FROM chosen) AS q
    LEFT JOIN unnest(p_limited::text[], p_caps::integer[]) AS lim(name, cap)
           ON lim.name = q.name
),
limits AS (
    SELECT * FROM unnest(p_flow_workflows::text[], p_key_caps::integer[],
                         p_flow_caps::integer[], p_rates::integer[], p_pers::interval[])
        AS l(workflow, key_cap, cap, rate, per)
),
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
-- Each chosen key's room: its queue's, its own (concurrency_per_key), its
-- workflow's (concurrency), and how many may still begin (rate_per_key; NULL: no
-- rate).
slots AS (
    SELECT chosen.queue, chosen.flow_key, chosen.workflow, chosen.turn_at,
           limits.key_cap - COALESCE(busy.n, 0) AS key_room,
           LEAST(open_queues.room, p_limit,
                 COALESCE(limits.key_cap - COALESCE(busy.n, 0), p_limit),
                 COALESCE(workflow_room.room, p_limit)) AS room,
           CASE WHEN limits.rate IS NOT NULL THEN limits.rate - (
               SELECT count(*) FROM durable_run AS begun
               WHERE begun.workflow = chosen.workflow AND begun.flow_key = chosen.flow_key
                 AND begun.started_at IS NOT NULL AND begun.started_at > v_now - limits.per)
           END AS begins
    FROM chosen
    JOIN open_queues ON open_queues.name = chosen.queue
    LEFT JOIN limits ON limits.workflow = chosen.workflow
    LEFT JOIN busy ON busy.workflow = chosen.workflow AND busy.flow_key = chosen.flow_key
    LEFT JOIN workflow_room ON workflow_room.workflow = chosen.workflow
    WHERE chosen.flow_key IS NOT NULL
),
-- Up to its room of each chosen key's due runs (read: this claimer holds the key),
-- and of the runs without a flow key of each queue whose turn was chosen (but none
-- of a workflow at its workflow-wide limit), locked.
candidates AS MATERIALIZED (
    SELECT c.id, c.queue, c.flow_key, c.workflow, c.priority, c.due_at, c.started_at,
           slots.turn_at, slots.key_room, slots.begins
    FROM slots
    CROSS JOIN LATERAL (
        SELECT r.id, r.queue, r.flow_key, r.workflow, r.priority, r.due_at, r.started_at
        FROM durable_run AS r
        WHERE r.queue = slots.queue AND r.flow_key = slots.flow_key
          AND r.workflow = slots.workflow
          AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
          AND r.due_at <= v_now
        -- In claim order, spelled as durable_run_flow holds it (v2 says why).
        ORDER BY r.flow_key, r.workflow, r.priority DESC, r.due_at, r.id
        LIMIT GREATEST(slots.room, 0)
    ) AS c
    UNION ALL
    SELECT c.id, c.queue, NULL, c.workflow, c.priority, c.due_at, c.started_at,
           chosen.turn_at, NULL, NULL
    FROM chosen
    JOIN open_queues ON open_queues.name = chosen.queue
    CROSS JOIN LATERAL (
        SELECT r.id, r.queue, r.workflow, r.priority, r.due_at, r.started_at
        FROM durable_run AS r
        WHERE r.queue = chosen.queue AND r.flow_key IS NULL
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
    WHERE chosen.flow_key IS NULL
),
-- Each candidate's round within its (queue, flow key), and its place among its
-- key's first claims (for the rate).
ranked AS (
    SELECT candidates.*,
           row_number() OVER (PARTITION BY candidates.queue, candidates.flow_key
                              ORDER BY candidates.priority DESC, candidates.due_at) AS round,
           row_number() OVER (PARTITION BY candidates.workflow, candidates.flow_key,
                                           candidates.started_at IS NULL
                              ORDER BY candidates.priority DESC, candidates.due_at) AS begin_n
    FROM candidates
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
    SELECT fair.id
    FROM fair
    JOIN open_queues ON open_queues.name = fair.queue
    LEFT JOIN workflow_room ON workflow_room.workflow = fair.workflow
    WHERE fair.queue_n <= open_queues.room
      AND (workflow_room.room IS NULL OR fair.workflow_n <= workflow_room.room)
      AND (fair.key_room IS NULL OR fair.key_n <= fair.key_room)
    ORDER BY fair.priority DESC, fair.round, fair.turn_at NULLS FIRST, fair.due_at
    LIMIT p_limit
),
-- Only the picked runs are locked; one a claimer of an older release took since
-- the read is skipped or no longer claimable.
locked AS MATERIALIZED (
    SELECT r.id, r.queue, r.flow_key FROM durable_run AS r
    WHERE r.id = ANY (ARRAY(SELECT picked.id FROM picked))
      AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
    FOR UPDATE SKIP LOCKED
),
turned AS (
    INSERT INTO durable_flow_turn AS turn (queue, flow_key, claimed_at)
    SELECT DISTINCT locked.queue, COALESCE(locked.flow_key, ''), v_now
    FROM locked
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
WHERE durable_run.id = ANY (ARRAY(SELECT id FROM locked))
RETURNING durable_run.*;
END
$claim$;
