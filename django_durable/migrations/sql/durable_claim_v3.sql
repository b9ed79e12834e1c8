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
-- Otherwise (the flow path). What changed from v2, which read every key with
-- claimable runs at every claim (40 probes for 20 keys), serialised every claimer of
-- a limited workflow on one lock whether or not it had a run due, and locked a
-- claim's worth of runs of every key to rank them (80 row locks to claim 4 runs of 20
-- keys): v3 reads about as many keys as it claims from, takes the keys no other
-- claimer is claiming from (SKIP LOCKED, one level up), and locks only the runs it
-- picks.
-- 1. The workflow locks, in name order, waiting: exclusive for a workflow with a
--    workflow-wide limit that has a claimable run (concurrency counts every key, so
--    its claimers take turns, as in v2), shared for one with per-key limits only.
--    The shared lock only keeps a v3 claimer out while a v2 claimer, which takes it
--    exclusive, counts during a rolling deploy. Then the workflows at their
--    workflow-wide limit, counted after the lock.
-- 2. The keys, per open queue, in turns: priority level by priority level (the
--    highest with a due run first: one walk of durable_run_claim, as v1's), the
--    level's (flow key, workflow) pairs by a loose index scan of
--    durable_run_flow_level that starts after the queue's pointer (the flow key the
--    queue's last claim took last: the newest row of durable_flow_turn, through
--    durable_flow_turn_last), then the level's runs without a flow key (one more
--    key), then the pairs up to the pointer. The scan is read as the loop goes, so a
--    claim reads about as many pairs as it takes, however many keys have runs. A pair
--    is skipped when it has no due run at that level, when its workflow is not
--    served or is at its workflow-wide limit, or when its key is at a limit by this
--    read's counts (one at its rate stays when it has a resumed run due: the rate
--    counts begins only). Otherwise the claimer tries the key's transaction-level
--    advisory lock (per workflow and flow key) without waiting; it skips a key
--    another claimer holds, and stops once it holds the queue's room. One that holds
--    no key at the end waits for the first it skipped, so no claimer comes back
--    empty while a run is claimable. It waits for a key only when it holds none, and
--    takes workflow locks only before keys: no two claimers wait on each other in a
--    cycle.
-- 3. v_now, the database's clock, read after the locks.
-- 4. The claim, a new statement, so a new snapshot taken after the locks: it counts
--    what the previous holder of a key's (or workflow's) lock claimed and committed,
--    which makes the limits exact across workers and threads. Per key held: the room
--    its limits leave (concurrency_per_key less its running runs, concurrency less
--    the workflow's, the rate's limit less its begins since v_now - per, counted
--    through durable_run_flow_begun), then up to that room of its due runs at its
--    level, read without a row lock (no claimer of this release claims from a key
--    whose lock another holds). The runs without a flow key are read and locked FOR
--    UPDATE SKIP LOCKED, as by v1. The candidates are taken priority first, then
--    round by round across the keys (the first due run of every key, then the
--    second...), within a round in turn order. Only the picked runs are locked (FOR
--    UPDATE SKIP LOCKED, their claimable state checked again: a claimer of an older
--    release may have taken one since) and claimed as by v1, and the queue's pointer
--    moves to the last key, in turn order, the claim took from (one upsert per
--    queue).
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
    v_queue record;
    v_level integer;
    v_held integer;
    v_limit integer;
    -- The workflows with a workflow-wide limit whose lock this claimer holds, and
    -- those of them at their limit.
    v_capped text[] := '{}';
    v_full text[];
    -- The keys this claimer holds (step 2): (queue, flow key, workflow, priority
    -- level), in turn order; NULL flow key: a queue's runs without one.
    v_queues text[] := '{}';
    v_keys text[] := '{}';
    v_workflows text[] := '{}';
    v_levels integer[] := '{}';
    -- The first key it skipped.
    v_skipped_queue text;
    v_skipped_key text;
    v_skipped_workflow text;
    v_skipped_level integer;
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

    -- 1. The workflow locks, in name order, waiting: exclusive for a workflow with a
    -- workflow-wide limit that has a claimable run, shared for the other limited ones.
    FOR v_row IN
        SELECT l.workflow, l.cap
        FROM unnest(p_flow_workflows::text[], p_flow_caps::integer[]) AS l(workflow, cap)
        WHERE l.cap IS NULL OR EXISTS (
            SELECT 1 FROM durable_run AS r
            WHERE r.workflow = l.workflow
              AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL)
        ORDER BY l.workflow
    LOOP
        IF v_row.cap IS NOT NULL THEN
            PERFORM pg_advisory_xact_lock(
                hashtextextended('django_durable.flow:' || v_row.workflow, 0));
            v_capped := v_capped || v_row.workflow;
        ELSE
            PERFORM pg_advisory_xact_lock_shared(
                hashtextextended('django_durable.flow:' || v_row.workflow, 0));
        END IF;
    END LOOP;
    -- The workflows at their workflow-wide limit (exact: counted after their lock).
    SELECT coalesce(array_agg(l.workflow), '{}') INTO v_full
    FROM unnest(p_flow_workflows::text[], p_flow_caps::integer[]) AS l(workflow, cap)
    WHERE l.workflow = ANY (v_capped) AND l.cap <= (
        SELECT count(*) FROM durable_run AS held
        WHERE held.workflow = l.workflow
          AND held.status IN ('running', 'compensating') AND held.lease_expires_at IS NOT NULL);

    -- 2. The keys, per open queue: priority level by priority level, in turns from the
    -- queue's pointer; each tried without waiting.
    FOR v_queue IN
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
)
SELECT served.name,
       CASE WHEN lim.cap IS NULL THEN p_limit
            ELSE LEAST(p_limit, lim.cap - (
                SELECT count(*) FROM durable_run AS held
                WHERE held.queue = served.name
                  AND held.status IN ('running', 'compensating')
                  AND held.lease_expires_at IS NOT NULL))
       END AS room,
       -- The pointer: the key the queue's last claim took last (durable_flow_turn_last).
       coalesce((SELECT t.flow_key FROM durable_flow_turn AS t
                 WHERE t.queue = served.name
                 ORDER BY t.claimed_at DESC LIMIT 1), '') AS pointer
FROM served
LEFT JOIN unnest(p_limited::text[], p_caps::integer[]) AS lim(name, cap)
       ON lim.name = served.name
WHERE served.name IS NOT NULL
  AND NOT COALESCE((SELECT q.paused FROM durable_queue AS q WHERE q.name = served.name),
                   false)
ORDER BY served.name
    LOOP
        CONTINUE WHEN v_queue.room <= 0;
        v_held := 0;
        v_level := NULL;
        LOOP
            -- The next priority level with a due run of a served workflow (one walk
            -- of durable_run_claim, as v1's claim).
            IF v_level IS NULL THEN
                SELECT r.priority INTO v_level FROM durable_run AS r
                WHERE r.queue = v_queue.name
                  AND r.status IN ('pending', 'waiting', 'compensating')
                  AND r.due_at IS NOT NULL AND r.due_at <= statement_timestamp()
                  AND (p_workflows::text[] IS NULL OR r.workflow = ANY (p_workflows::text[])
                       OR r.workflow LIKE ANY (p_prefixes::text[]))
                ORDER BY r.priority DESC, r.due_at
                LIMIT 1;
            ELSE  -- (a separate statement: an OR would keep the index from the bound)
                SELECT r.priority INTO v_level FROM durable_run AS r
                WHERE r.queue = v_queue.name AND r.priority < v_level
                  AND r.status IN ('pending', 'waiting', 'compensating')
                  AND r.due_at IS NOT NULL AND r.due_at <= statement_timestamp()
                  AND (p_workflows::text[] IS NULL OR r.workflow = ANY (p_workflows::text[])
                       OR r.workflow LIKE ANY (p_prefixes::text[]))
                ORDER BY r.priority DESC, r.due_at
                LIMIT 1;
            END IF;
            EXIT WHEN NOT FOUND;
            -- This level's keys after the pointer, its runs without a flow key, then
            -- its keys up to the pointer: each (flow key, workflow) once, with its
            -- first due time at this level (a loose index scan of
            -- durable_run_flow_level, one probe per pair).
            FOR v_row IN
WITH RECURSIVE ahead(flow_key, workflow, due_at) AS (
    (SELECT r.flow_key, r.workflow, r.due_at FROM durable_run AS r
     WHERE r.queue = v_queue.name AND r.priority = v_level AND r.flow_key IS NOT NULL
       AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
       AND r.flow_key > v_queue.pointer
     ORDER BY r.flow_key, r.workflow, r.due_at LIMIT 1)
    UNION ALL
    SELECT next.flow_key, next.workflow, next.due_at
    FROM ahead
    CROSS JOIN LATERAL (
        SELECT r.flow_key, r.workflow, r.due_at FROM durable_run AS r
        WHERE r.queue = v_queue.name AND r.priority = v_level AND r.flow_key IS NOT NULL
          AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
          AND (r.flow_key, r.workflow) > (ahead.flow_key, ahead.workflow)
        ORDER BY r.flow_key, r.workflow, r.due_at LIMIT 1
    ) AS next
),
behind(flow_key, workflow, due_at) AS (
    (SELECT r.flow_key, r.workflow, r.due_at FROM durable_run AS r
     WHERE r.queue = v_queue.name AND r.priority = v_level AND r.flow_key IS NOT NULL
       AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
       AND r.flow_key <= v_queue.pointer
     ORDER BY r.flow_key, r.workflow, r.due_at LIMIT 1)
    UNION ALL
    SELECT next.flow_key, next.workflow, next.due_at
    FROM behind
    CROSS JOIN LATERAL (
        SELECT r.flow_key, r.workflow, r.due_at FROM durable_run AS r
        WHERE r.queue = v_queue.name AND r.priority = v_level AND r.flow_key IS NOT NULL
          AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
          AND (r.flow_key, r.workflow) > (behind.flow_key, behind.workflow)
          AND r.flow_key <= v_queue.pointer
        ORDER BY r.flow_key, r.workflow, r.due_at LIMIT 1
    ) AS next
)
(SELECT ahead.flow_key, ahead.workflow, ahead.due_at FROM ahead)
UNION ALL
(SELECT NULL, NULL, r.due_at FROM durable_run AS r
 WHERE r.queue = v_queue.name AND r.priority = v_level AND r.flow_key IS NULL
   AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
   AND r.due_at <= statement_timestamp()
   AND (p_workflows::text[] IS NULL OR r.workflow = ANY (p_workflows::text[])
        OR r.workflow LIKE ANY (p_prefixes::text[]))
   AND r.workflow <> ALL (v_full)
 ORDER BY r.due_at LIMIT 1)
UNION ALL
(SELECT behind.flow_key, behind.workflow, behind.due_at FROM behind)
            LOOP
                -- A pair is skipped when it has no due run at this level, when its
                -- workflow is not served or is at its workflow-wide limit, or when its
                -- key is at a limit by these counts (a key at its rate stays when its
                -- first due run is a resumed one: the rate counts begins only).
                CONTINUE WHEN v_row.due_at > statement_timestamp();
                IF v_row.flow_key IS NOT NULL THEN
                    CONTINUE WHEN NOT (p_workflows::text[] IS NULL
                                       OR v_row.workflow = ANY (p_workflows::text[])
                                       OR v_row.workflow LIKE ANY (p_prefixes::text[]));
                    CONTINUE WHEN v_row.workflow = ANY (v_full);
                    v_limit := array_position(p_flow_workflows::text[], v_row.workflow);
                    IF v_limit IS NOT NULL AND p_key_caps[v_limit] IS NOT NULL THEN
                        CONTINUE WHEN p_key_caps[v_limit] <= (
                            SELECT count(*) FROM durable_run AS held
                            WHERE held.workflow = v_row.workflow
                              AND held.flow_key = v_row.flow_key
                              AND held.status IN ('running', 'compensating')
                              AND held.lease_expires_at IS NOT NULL);
                    END IF;
                    IF v_limit IS NOT NULL AND p_rates[v_limit] IS NOT NULL THEN
                        CONTINUE WHEN p_rates[v_limit] <= (
                            SELECT count(*) FROM durable_run AS begun
                            WHERE begun.workflow = v_row.workflow
                              AND begun.flow_key = v_row.flow_key
                              AND begun.started_at IS NOT NULL
                              AND begun.started_at > statement_timestamp() - p_pers[v_limit])
                          AND NOT EXISTS (
                            SELECT 1 FROM durable_run AS r
                            WHERE r.queue = v_queue.name AND r.priority = v_level
                              AND r.flow_key = v_row.flow_key AND r.workflow = v_row.workflow
                              AND r.status IN ('pending', 'waiting', 'compensating')
                              AND r.due_at IS NOT NULL AND r.due_at <= statement_timestamp()
                              AND r.started_at IS NOT NULL);
                    END IF;
                    IF NOT pg_try_advisory_xact_lock(hashtextextended(
                           'django_durable.flow_key:' || length(v_row.workflow) || ':'
                           || v_row.workflow || ':' || v_row.flow_key, 0)) THEN
                        IF v_skipped_key IS NULL THEN
                            v_skipped_queue := v_queue.name;
                            v_skipped_key := v_row.flow_key;
                            v_skipped_workflow := v_row.workflow;
                            v_skipped_level := v_level;
                        END IF;
                        CONTINUE;
                    END IF;
                END IF;
                v_queues := v_queues || v_queue.name;
                v_keys := v_keys || v_row.flow_key;
                v_workflows := v_workflows || v_row.workflow;
                v_levels := v_levels || v_level;
                v_held := v_held + 1;
                EXIT WHEN v_held >= v_queue.room;
            END LOOP;
            EXIT WHEN v_held >= v_queue.room;
        END LOOP;
    END LOOP;
    -- A claimer that holds no key waits for the first it skipped.
    IF cardinality(v_queues) = 0 THEN
        IF v_skipped_key IS NULL THEN
            RETURN;  -- nothing claimable
        END IF;
        PERFORM pg_advisory_xact_lock(hashtextextended(
            'django_durable.flow_key:' || length(v_skipped_workflow) || ':'
            || v_skipped_workflow || ':' || v_skipped_key, 0));
        v_queues := ARRAY[v_skipped_queue];
        v_keys := ARRAY[v_skipped_key];
        v_workflows := ARRAY[v_skipped_workflow];
        v_levels := ARRAY[v_skipped_level];
    END IF;

    -- 3. The database's clock, after the locks.
    v_now := clock_timestamp();

    -- 4. The claim.
    RETURN QUERY
WITH chosen AS (
    SELECT c.queue, c.flow_key, c.workflow, c.level, c.n
    FROM unnest(v_queues, v_keys, v_workflows, v_levels) WITH ORDINALITY
        AS c(queue, flow_key, workflow, level, n)
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
-- The running runs of the chosen keys of limited workflows, per key, and of the
-- workflows with a workflow-wide limit (NULL: none).
busy AS (
    SELECT chosen.workflow, chosen.flow_key, (
               SELECT count(*) FROM durable_run AS held
               WHERE held.workflow = chosen.workflow AND held.flow_key = chosen.flow_key
                 AND held.status IN ('running', 'compensating')
                 AND held.lease_expires_at IS NOT NULL) AS n
    FROM (SELECT DISTINCT chosen.workflow, chosen.flow_key FROM chosen
          JOIN limits ON limits.workflow = chosen.workflow
          WHERE limits.key_cap IS NOT NULL) AS chosen
),
workflow_room AS (
    SELECT limits.workflow,
           limits.cap - (SELECT count(*) FROM durable_run AS held
                         WHERE held.workflow = limits.workflow
                           AND held.status IN ('running', 'compensating')
                           AND held.lease_expires_at IS NOT NULL) AS room
    FROM limits
    WHERE limits.cap IS NOT NULL
),
-- Each chosen key's room: its queue's, its own (concurrency_per_key), its
-- workflow's (concurrency), and how many may still begin (rate_per_key; NULL: no
-- rate).
slots AS (
    SELECT chosen.queue, chosen.flow_key, chosen.workflow, chosen.level, chosen.n,
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
-- Up to its room of each chosen key's due runs at its level (read: this claimer holds
-- the key), and of the runs without a flow key of each queue chosen at a level (but
-- none of a workflow at its workflow-wide limit), locked.
candidates AS MATERIALIZED (
    SELECT c.id, c.queue, c.flow_key, c.workflow, c.priority, c.due_at, c.started_at,
           slots.n, slots.key_room, slots.begins
    FROM slots
    CROSS JOIN LATERAL (
        SELECT r.id, r.queue, r.flow_key, r.workflow, r.priority, r.due_at, r.started_at
        FROM durable_run AS r
        WHERE r.queue = slots.queue AND r.priority = slots.level
          AND r.flow_key = slots.flow_key AND r.workflow = slots.workflow
          AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
          AND r.due_at <= v_now
        ORDER BY r.flow_key, r.workflow, r.due_at, r.id
        LIMIT GREATEST(slots.room, 0)
    ) AS c
    UNION ALL
    SELECT c.id, c.queue, NULL, c.workflow, c.priority, c.due_at, c.started_at,
           chosen.n, NULL, NULL
    FROM chosen
    JOIN open_queues ON open_queues.name = chosen.queue
    CROSS JOIN LATERAL (
        SELECT r.id, r.queue, r.workflow, r.priority, r.due_at, r.started_at
        FROM durable_run AS r
        WHERE r.queue = chosen.queue AND r.priority = chosen.level AND r.flow_key IS NULL
          AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
          AND r.due_at <= v_now
          AND (p_workflows::text[] IS NULL OR r.workflow = ANY (p_workflows::text[])
               OR r.workflow LIKE ANY (p_prefixes::text[]))
          AND NOT EXISTS (SELECT 1 FROM workflow_room AS full_
                          WHERE full_.workflow = r.workflow AND full_.room <= 0)
        ORDER BY r.due_at
        LIMIT LEAST(open_queues.room, p_limit)
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE chosen.flow_key IS NULL
),
-- Each candidate's round within its (queue, flow key, level), and its place among its
-- key's first claims (for the rate).
ranked AS (
    SELECT candidates.*,
           row_number() OVER (PARTITION BY candidates.n
                              ORDER BY candidates.due_at) AS round,
           row_number() OVER (PARTITION BY candidates.workflow, candidates.flow_key,
                                           candidates.started_at IS NULL
                              ORDER BY candidates.priority DESC, candidates.due_at) AS begin_n
    FROM candidates
),
-- In turns, with the rate's room applied (a resumed run does not begin again).
fair AS (
    SELECT ranked.*,
           row_number() OVER (PARTITION BY ranked.queue
                              ORDER BY ranked.priority DESC, ranked.round, ranked.n) AS queue_n,
           row_number() OVER (PARTITION BY ranked.workflow
                              ORDER BY ranked.priority DESC, ranked.round, ranked.n) AS workflow_n,
           row_number() OVER (PARTITION BY ranked.workflow, ranked.flow_key
                              ORDER BY ranked.priority DESC, ranked.due_at) AS key_n
    FROM ranked
    WHERE ranked.begins IS NULL OR ranked.started_at IS NOT NULL
       OR ranked.begin_n <= ranked.begins
),
picked AS (
    SELECT fair.id, fair.n
    FROM fair
    JOIN open_queues ON open_queues.name = fair.queue
    LEFT JOIN workflow_room ON workflow_room.workflow = fair.workflow
    WHERE fair.queue_n <= open_queues.room
      AND (workflow_room.room IS NULL OR fair.workflow_n <= workflow_room.room)
      AND (fair.key_room IS NULL OR fair.key_n <= fair.key_room)
    ORDER BY fair.priority DESC, fair.round, fair.n
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
-- The queue's pointer moves to the last key, in turn order, that this claim took
-- from: one row per queue.
turned AS (
    INSERT INTO durable_flow_turn AS turn (queue, flow_key, claimed_at)
    SELECT DISTINCT ON (locked.queue) locked.queue, COALESCE(locked.flow_key, ''), v_now
    FROM locked
    JOIN picked ON picked.id = locked.id
    ORDER BY locked.queue, picked.n DESC
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
