-- durable_claim_v4: a worker's claim of up to p_limit due runs, in one call (one round
-- trip), with flow control by key (docs/flow-control.md). Created by migration 0005;
-- never edited: a change is a durable_claim_v5 beside it, in a new migration
-- (docs/production.md, "Upgrading"). durable_claim_v3, _v2 and _v1 stay beside it for
-- the previous releases' workers during a rolling deploy.
--
-- Arguments: those of durable_claim_v2 (the same call under a new name).
--
-- Two paths, chosen as by v2 and v3. When no claimable run of the served queues has a
-- flow key, and none belongs to a workflow with a workflow-wide limit, the claim is
-- durable_claim_v1's statement, unchanged. The probe that decides reads
-- durable_run_flow in its own order, so that no plan reads the table for it (v2's
-- EXISTS could: 1.5-2 ms a claim once 8,000 runs had finished).
--
-- Otherwise (the flow path), as v3, with one change: the common claim is one
-- statement. v3 read the keys it would take and locked them in one statement, then
-- claimed their runs in a second, whose newer snapshot made each key's count of
-- running runs exact; with the steps between, a claim of 4 runs of 20 keys ran a
-- dozen statements, and took about twice as long as a claim without flow keys.
-- 1. The workflow locks, in name order, waiting: exclusive for a workflow with a
--    workflow-wide limit that has a claimable run (concurrency counts every key, so
--    its claimers take turns, as in v2), shared for one with per-key limits only.
--    The shared lock only keeps a v3 or v4 claimer out while a v2 claimer, which
--    takes it exclusive, counts during a rolling deploy. Then the room each
--    workflow-wide limit leaves (counted after its lock: exact).
-- 2. The one-statement claim: when the claimer serves one queue (or one queue has
--    claimable runs), no limited workflow has a rate, and none with a workflow-wide
--    limit has a claimable run. The queue's highest priority level with a due run
--    (one walk of durable_run_claim, as v1's), its (flow key, workflow) pairs by a
--    loose index scan of durable_run_flow_level that starts after the queue's pointer
--    (the flow key the queue's last claim took last: the newest row of
--    durable_flow_turn, through durable_flow_turn_last), then its runs without a flow
--    key (as one more key), then the pairs up to the pointer. Each pair's entry there
--    is its first due run (the index ends with due time and id). The scan is read only
--    as far as the claim needs, however many keys have runs. A pair is left out when
--    its run is not due, when its workflow is not served, or when its key is at its
--    concurrency_per_key by this statement's snapshot; otherwise the claimer tries the
--    key's transaction-level advisory lock without waiting (a key another claimer
--    holds is skipped), and, for a key with a limit, counts its running runs again
--    through durable_key_running_v1, a volatile function, so on a snapshot taken after
--    the lock: exact, though this statement's own snapshot is older. Its run is then
--    locked FOR UPDATE SKIP LOCKED (one an older claimer took since fails the
--    lock's re-check and its key gives nothing this time), and claimed; the pointer
--    moves to the last key taken. One run per key: a claim of 4 from 20 keys is done
--    here. When it leaves room (fewer keys than the claim's limit at the level, keys
--    at their limit or held elsewhere), the steps below claim the rest.
-- 3. The keys, per queue, in turns: priority level by priority level, the pairs of
--    the level as in step 2, one statement per level. A pair is also left out when
--    its workflow is at its workflow-wide limit, or its key at its rate (one at its
--    rate stays when it has a resumed run due: the rate counts begins only); the
--    counts read at most the limit's worth of index entries (durable_run_flow_busy,
--    durable_run_flow_begun). The claimer tries each key's lock without waiting, and
--    stops once it holds as many keys as the queue has room. One that holds no key
--    at the end finds the first key another claimer holds (the same statement,
--    trying no lock), waits for it, then reads again, so no claimer comes back empty
--    while a run is claimable. It waits for a key only when it holds none (after
--    step 2 took nothing, only when pg_locks shows it holds no key lock), and takes
--    workflow locks only before keys: no two claimers wait on each other in a cycle.
-- 4. How many runs each key held gives: priority level by priority level, round by
--    round (one run of every key in turn order, then a second...), within its queue's
--    room, its workflow's workflow-wide room and p_limit. When the claim holds p_limit
--    keys and none has a rate, each gives one; otherwise a statement counts, after the
--    locks, what each can give (due runs at its level, the room concurrency_per_key
--    leaves, and for a rate its resumed due runs and the begins left).
-- 5. The claim, a new statement, so a snapshot taken after the locks: each key's
--    share, within the room concurrency_per_key leaves counted again here (exact: the
--    previous holder of the key's lock committed before this snapshot), of its due
--    runs at its level in due order (read in the index's order: the LIMIT stops the
--    read), locked FOR UPDATE SKIP LOCKED; a key with a rate gives its resumed runs
--    first, then no more new ones than may begin (through durable_run_flow_begun).
--    The runs without a flow key are kept within what their workflows' workflow-wide
--    limits leave. They are claimed as by v1, and the queue's pointer moves to the
--    key, at the highest level taken, last in turn order (one upsert per queue).
-- The running runs counted are those a worker holds (status running or compensating
-- with a lease): a dead worker's run counts until its lease runs out and recovery
-- returns it. A filter that drops a run never lets another past a limit: it can only
-- leave the claim with fewer runs, which the worker's next claim takes.
--
-- A function keeps the plan of its statements for the database session; "jit = off"
-- as for v1. "enable_incremental_sort = off": a key's share is read in
-- durable_run_flow's order; with 1M due runs of one key, the generic plan otherwise
-- read another key's share through durable_run_claim (which gives the due order for
-- an incremental sort), walking the backlog: 0.7 s a claim, 3 ms without.
CREATE OR REPLACE FUNCTION durable_claim_v4(
    p_queues text[], p_limit integer, p_limited text[], p_caps integer[],
    p_workflows text[], p_prefixes text[], p_worker varchar, p_lease interval,
    p_flow_workflows text[], p_key_caps integer[], p_flow_caps integer[],
    p_rates integer[], p_pers interval[]
) RETURNS SETOF durable_run
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_incremental_sort = off
AS $claim$
DECLARE
    v_flow boolean := false;
    v_now timestamptz;
    v_row record;
    -- The queues served, the one being read, its room and its pointer.
    v_served text[];
    v_name text;
    v_room integer;
    v_pointer text;
    v_read_pointer text;
    v_level integer;
    v_bound integer;
    v_pos integer;
    -- The workflows with a workflow-wide limit whose lock this claimer holds, the room
    -- each leaves, and those at their limit.
    v_capped text[] := '{}';
    v_capped_room integer[] := '{}';
    v_full text[] := '{}';
    -- The keys this claimer holds (step 3), in turn order per queue and level: (queue,
    -- flow key, workflow, priority level, place in turn), how many due runs each can
    -- give, and (for a key with a rate) how many of those are resumed (NULL: no rate).
    -- A NULL flow key stands for a queue's runs without one.
    v_queues text[] := '{}';
    v_keys text[] := '{}';
    v_workflows text[] := '{}';
    v_levels integer[] := '{}';
    v_places integer[] := '{}';
    v_avails integer[] := '{}';
    v_resumeds integer[] := '{}';
    -- Each queue's room left, the first key skipped, and whether it was waited for.
    v_room_queues text[] := '{}';
    v_room_left integer[] := '{}';
    v_skipped_id text;
    v_waited boolean := false;
    v_probing boolean := false;
    -- Whether the one-statement claim ran.
    v_fast boolean := false;
    -- What one level's statement gives: the keys it holds, in turn order.
    v_got_keys text[];
    v_got_workflows text[];
    v_got_ids text[];
    v_got_places integer[];
    -- Whether a limited workflow has a rate.
    v_rated boolean;
    -- Step 4: the keys in order, each one's share, and the loop's state.
    v_order integer[];
    v_allots integer[];
    v_total integer;
    v_first integer;
    v_progress boolean;
    v_n integer;
    v_i integer;
    v_q integer;
    v_wf integer;
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
    IF NOT v_flow AND cardinality(array_remove(p_flow_caps::integer[], NULL)) > 0 THEN
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
    -- The room each workflow-wide limit leaves (exact: counted after its lock).
    IF cardinality(v_capped) > 0 THEN
        SELECT array_agg(l.cap - (
                   SELECT count(*) FROM durable_run AS held
                   WHERE held.workflow = l.workflow
                     AND held.status IN ('running', 'compensating')
                     AND held.lease_expires_at IS NOT NULL) ORDER BY c.n)
        INTO v_capped_room
        FROM unnest(v_capped) WITH ORDINALITY AS c(workflow, n)
        JOIN unnest(p_flow_workflows::text[], p_flow_caps::integer[]) AS l(workflow, cap)
          ON l.workflow = c.workflow;
        SELECT coalesce(array_agg(c.workflow), '{}') INTO v_full
        FROM unnest(v_capped, v_capped_room) AS c(workflow, room)
        WHERE c.room <= 0;
    END IF;

    -- Whether a limited workflow has a rate (step 2 runs only without one).
    v_rated := coalesce(cardinality(array_remove(p_rates::integer[], NULL)) > 0, false);

    -- The queues served: p_queues, or (NULL) every queue with a claimable run, found by
    -- a loose index scan of durable_run_claim (one probe per queue).
    IF p_queues IS NULL THEN
        WITH RECURSIVE served(name) AS (
            (SELECT queue FROM durable_run
             WHERE status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
             ORDER BY queue LIMIT 1)
            UNION ALL
            SELECT (SELECT queue FROM durable_run
                    WHERE status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
                      AND queue > served.name
                    ORDER BY queue LIMIT 1)
            FROM served
            WHERE served.name IS NOT NULL
        )
        SELECT coalesce(array_agg(served.name::text), '{}') INTO v_served
        FROM served WHERE served.name IS NOT NULL;
    ELSE
        v_served := p_queues;
    END IF;

    -- 2. The claim in one statement, when it can be: one queue, no rate, no
    -- workflow-wide limit with a claimable run. One run per key, the first due of its
    -- pair, as the walk reads it; the steps below claim what it leaves.
    IF cardinality(v_served) = 1 AND NOT v_rated AND cardinality(v_capped) = 0 THEN
        v_name := v_served[1];
        RETURN QUERY
    WITH RECURSIVE queue(room, pointer) AS MATERIALIZED (
        SELECT CASE
               WHEN coalesce((SELECT q.paused FROM durable_queue AS q WHERE q.name = v_name),
                             false) THEN 0
               WHEN p_caps[array_position(p_limited::text[], v_name)] IS NULL THEN p_limit
               ELSE LEAST(p_limit, p_caps[array_position(p_limited::text[], v_name)] - (
                   SELECT count(*) FROM durable_run AS held
                   WHERE held.queue = v_name
                     AND held.status IN ('running', 'compensating')
                     AND held.lease_expires_at IS NOT NULL))
               END,
               coalesce((SELECT t.flow_key FROM durable_flow_turn AS t
                         WHERE t.queue = v_name
                         ORDER BY t.claimed_at DESC LIMIT 1), '')
    ),
    level(priority) AS MATERIALIZED (
        SELECT r.priority FROM durable_run AS r
        WHERE r.queue = v_name
          AND r.status IN ('pending', 'waiting', 'compensating')
          AND r.due_at IS NOT NULL AND r.due_at <= statement_timestamp()
          AND (p_workflows::text[] IS NULL OR r.workflow = ANY (p_workflows::text[])
               OR r.workflow LIKE ANY (p_prefixes::text[]))
          AND (SELECT room FROM queue) > 0
        ORDER BY r.priority DESC, r.due_at
        LIMIT 1
    ),
    ahead(flow_key, workflow, due_at, id) AS (
        (SELECT r.flow_key, r.workflow, r.due_at, r.id FROM durable_run AS r
         WHERE r.queue = v_name AND r.priority = (SELECT priority FROM level)
           AND r.flow_key IS NOT NULL
           AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
           AND r.flow_key > (SELECT pointer FROM queue)
         ORDER BY r.flow_key, r.workflow, r.due_at, r.id LIMIT 1)
        UNION ALL
        SELECT next.flow_key, next.workflow, next.due_at, next.id
        FROM ahead
        CROSS JOIN LATERAL (
            SELECT r.flow_key, r.workflow, r.due_at, r.id FROM durable_run AS r
            WHERE r.queue = v_name AND r.priority = (SELECT priority FROM level)
              AND r.flow_key IS NOT NULL
              AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
              AND (r.flow_key, r.workflow) > (ahead.flow_key, ahead.workflow)
            ORDER BY r.flow_key, r.workflow, r.due_at, r.id LIMIT 1
        ) AS next
    ),
    behind(flow_key, workflow, due_at, id) AS (
        (SELECT r.flow_key, r.workflow, r.due_at, r.id FROM durable_run AS r
         WHERE r.queue = v_name AND r.priority = (SELECT priority FROM level)
           AND r.flow_key IS NOT NULL
           AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
           AND r.flow_key <= (SELECT pointer FROM queue)
         ORDER BY r.flow_key, r.workflow, r.due_at, r.id LIMIT 1)
        UNION ALL
        SELECT next.flow_key, next.workflow, next.due_at, next.id
        FROM behind
        CROSS JOIN LATERAL (
            SELECT r.flow_key, r.workflow, r.due_at, r.id FROM durable_run AS r
            WHERE r.queue = v_name AND r.priority = (SELECT priority FROM level)
              AND r.flow_key IS NOT NULL
              AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
              AND (r.flow_key, r.workflow) > (behind.flow_key, behind.workflow)
              AND r.flow_key <= (SELECT pointer FROM queue)
            ORDER BY r.flow_key, r.workflow, r.due_at, r.id LIMIT 1
        ) AS next
    ),
    taken AS MATERIALIZED (
        SELECT run.id, pair.part, pair.flow_key, pair.workflow
        FROM (
            SELECT 1 AS part, ahead.flow_key, ahead.workflow, ahead.due_at, ahead.id FROM ahead
            UNION ALL
            (SELECT 2, NULL, NULL, r.due_at, r.id FROM durable_run AS r
             WHERE r.queue = v_name AND r.priority = (SELECT priority FROM level)
               AND r.flow_key IS NULL
               AND r.status IN ('pending', 'waiting', 'compensating')
               AND r.due_at IS NOT NULL AND r.due_at <= statement_timestamp()
               AND (p_workflows::text[] IS NULL OR r.workflow = ANY (p_workflows::text[])
                    OR r.workflow LIKE ANY (p_prefixes::text[]))
             ORDER BY r.due_at LIMIT 1)
            UNION ALL
            SELECT 3, behind.flow_key, behind.workflow, behind.due_at, behind.id FROM behind
        ) AS pair
        CROSS JOIN LATERAL (
            SELECT array_position(p_flow_workflows::text[], pair.workflow::text) AS limited
        ) AS key
        CROSS JOIN LATERAL (
            SELECT r.id FROM durable_run AS r
            WHERE r.id = pair.id
              AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
              AND r.due_at <= statement_timestamp()
            FOR UPDATE SKIP LOCKED
        ) AS run
        WHERE pair.due_at <= statement_timestamp()
          AND CASE
              WHEN pair.flow_key IS NULL THEN true
              WHEN NOT (p_workflows::text[] IS NULL
                        OR pair.workflow = ANY (p_workflows::text[])
                        OR pair.workflow LIKE ANY (p_prefixes::text[])) THEN false
              -- At its limit by this statement's snapshot: left out, its lock not tried.
              WHEN p_key_caps[key.limited] IS NOT NULL
                   AND (SELECT count(*) FROM (
                            SELECT 1 FROM durable_run AS held
                            WHERE held.workflow = pair.workflow
                              AND held.flow_key = pair.flow_key
                              AND held.status IN ('running', 'compensating')
                              AND held.lease_expires_at IS NOT NULL
                            LIMIT p_key_caps[key.limited]) AS busy)
                       >= p_key_caps[key.limited] THEN false
              WHEN NOT pg_try_advisory_xact_lock(hashtextextended(
                       'django_durable.flow_key:' || length(pair.workflow) || ':'
                       || pair.workflow || ':' || pair.flow_key, 0)) THEN false
              WHEN p_key_caps[key.limited] IS NULL THEN true
              ELSE durable_key_running_v1(pair.workflow, pair.flow_key, p_key_caps[key.limited])
                   < p_key_caps[key.limited]
              END
        LIMIT (SELECT room FROM queue)
    ),
    turned AS (
        INSERT INTO durable_flow_turn AS turn (queue, flow_key, claimed_at)
        SELECT v_name, COALESCE(taken.flow_key, ''), statement_timestamp()
        FROM taken
        ORDER BY taken.part DESC, taken.flow_key DESC, taken.workflow DESC
        LIMIT 1
        ON CONFLICT (queue, flow_key) DO UPDATE SET claimed_at = EXCLUDED.claimed_at
    )
UPDATE durable_run SET
    status = CASE WHEN status = 'compensating' THEN 'compensating' ELSE 'running' END,
    due_at = CASE WHEN status = 'compensating' THEN NULL ELSE durable_run.due_at END,
    worker_id = p_worker,
    lease_expires_at = statement_timestamp() + p_lease,
    fence = fence + 1,
    started_at = COALESCE(started_at, statement_timestamp())
WHERE durable_run.id = ANY (ARRAY(SELECT id FROM taken))
RETURNING durable_run.*;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        IF v_n >= p_limit THEN
            RETURN;
        END IF;
        p_limit := p_limit - v_n;  -- the steps below claim the rest
        -- A claimer that holds a key waits for none (below): with a run, it holds one;
        -- without, it may hold a key found at its limit after the lock.
        v_fast := true;
        v_waited := v_n > 0;
    END IF;

    -- 3. The keys, per queue: priority level by priority level, in turns from the
    -- queue's pointer, each tried without waiting, in one statement per level. When a
    -- pass holds no key, a second pass finds the first key a claimer holds (the same
    -- statement, trying no lock), waits for it, and a third pass reads again.
    LOOP
        FOREACH v_name IN ARRAY v_served LOOP
            v_pos := 0;
            v_bound := 2147483647;
            v_room := NULL;
            v_pointer := NULL;
            LOOP
                -- One statement per level:
                -- - the queue, read at its first level: its room (none while paused; the
                --   claim's limit, or what the queue's limit leaves beside its running
                --   runs) and its pointer (the key its last claim took last, through
                --   durable_flow_turn_last);
                -- - the level: the highest priority at or below v_bound with a due run
                --   of a served workflow (one walk of durable_run_claim, as v1's claim);
                -- - the level's (flow key, workflow) pairs after the pointer, its runs
                --   without a flow key (as one more key), then its pairs up to the
                --   pointer: each pair once, with its first due time at the level (a
                --   loose index scan of durable_run_flow_level, one probe per pair);
                -- - a filter that leaves out a pair with no due run, of a workflow not
                --   served or at its workflow-wide limit, or with a key at its
                --   concurrency_per_key or at its rate (one at its rate stays when it
                --   has a resumed run due: the rate counts begins only), then tries the
                --   key's advisory lock without waiting. A CASE: in that order. The
                --   counts read at most the limit's worth of entries
                --   (durable_run_flow_busy, durable_run_flow_begun); they only leave
                --   keys out, step 4 and the claim count again after the locks.
                -- The rows are read only as the LIMIT asks: the scan stops once the
                -- claimer holds as many keys as the queue has room, however many keys
                -- have runs.
    WITH RECURSIVE queue(room, pointer) AS MATERIALIZED (
        SELECT CASE
               WHEN v_room IS NOT NULL THEN v_room
               WHEN coalesce((SELECT q.paused FROM durable_queue AS q WHERE q.name = v_name),
                             false) THEN 0
               WHEN p_caps[array_position(p_limited::text[], v_name)] IS NULL THEN p_limit
               ELSE LEAST(p_limit, p_caps[array_position(p_limited::text[], v_name)] - (
                   SELECT count(*) FROM durable_run AS held
                   WHERE held.queue = v_name
                     AND held.status IN ('running', 'compensating')
                     AND held.lease_expires_at IS NOT NULL))
               END,
               coalesce(v_pointer, (SELECT t.flow_key FROM durable_flow_turn AS t
                                    WHERE t.queue = v_name
                                    ORDER BY t.claimed_at DESC LIMIT 1), '')
    ),
    level(priority) AS MATERIALIZED (
        SELECT r.priority FROM durable_run AS r
        WHERE r.queue = v_name AND r.priority <= v_bound
          AND r.status IN ('pending', 'waiting', 'compensating')
          AND r.due_at IS NOT NULL AND r.due_at <= statement_timestamp()
          AND (p_workflows::text[] IS NULL OR r.workflow = ANY (p_workflows::text[])
               OR r.workflow LIKE ANY (p_prefixes::text[]))
          AND (SELECT room FROM queue) > v_pos
        ORDER BY r.priority DESC, r.due_at
        LIMIT 1
    ),
    ahead(flow_key, workflow, due_at) AS (
        (SELECT r.flow_key, r.workflow, r.due_at FROM durable_run AS r
         WHERE r.queue = v_name AND r.priority = (SELECT priority FROM level)
           AND r.flow_key IS NOT NULL
           AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
           AND r.flow_key > (SELECT pointer FROM queue)
         ORDER BY r.flow_key, r.workflow, r.due_at LIMIT 1)
        UNION ALL
        SELECT next.flow_key, next.workflow, next.due_at
        FROM ahead
        CROSS JOIN LATERAL (
            SELECT r.flow_key, r.workflow, r.due_at FROM durable_run AS r
            WHERE r.queue = v_name AND r.priority = (SELECT priority FROM level)
              AND r.flow_key IS NOT NULL
              AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
              AND (r.flow_key, r.workflow) > (ahead.flow_key, ahead.workflow)
            ORDER BY r.flow_key, r.workflow, r.due_at LIMIT 1
        ) AS next
    ),
    behind(flow_key, workflow, due_at) AS (
        (SELECT r.flow_key, r.workflow, r.due_at FROM durable_run AS r
         WHERE r.queue = v_name AND r.priority = (SELECT priority FROM level)
           AND r.flow_key IS NOT NULL
           AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
           AND r.flow_key <= (SELECT pointer FROM queue)
         ORDER BY r.flow_key, r.workflow, r.due_at LIMIT 1)
        UNION ALL
        SELECT next.flow_key, next.workflow, next.due_at
        FROM behind
        CROSS JOIN LATERAL (
            SELECT r.flow_key, r.workflow, r.due_at FROM durable_run AS r
            WHERE r.queue = v_name AND r.priority = (SELECT priority FROM level)
              AND r.flow_key IS NOT NULL
              AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
              AND (r.flow_key, r.workflow) > (behind.flow_key, behind.workflow)
              AND r.flow_key <= (SELECT pointer FROM queue)
            ORDER BY r.flow_key, r.workflow, r.due_at LIMIT 1
        ) AS next
    )
    SELECT (SELECT priority FROM level),
           (SELECT room FROM queue),
           (SELECT pointer FROM queue),
           coalesce(array_agg(got.flow_key ORDER BY got.n), '{}'),
           coalesce(array_agg(got.workflow ORDER BY got.n), '{}'),
           coalesce(array_agg(got.id ORDER BY got.n), '{}'),
           coalesce(array_agg((v_pos + got.n)::integer ORDER BY got.n), '{}')
    INTO v_level, v_room, v_read_pointer, v_got_keys, v_got_workflows, v_got_ids, v_got_places
    FROM (
        SELECT held.*, row_number() OVER (ORDER BY held.part, held.flow_key, held.workflow) AS n
        FROM (
            SELECT pair.part, pair.flow_key, pair.workflow, key.id
            FROM (
                SELECT 1 AS part, ahead.flow_key, ahead.workflow, ahead.due_at FROM ahead
                UNION ALL
                (SELECT 2, NULL, NULL, r.due_at FROM durable_run AS r
                 WHERE r.queue = v_name AND r.priority = (SELECT priority FROM level)
                   AND r.flow_key IS NULL
                   AND r.status IN ('pending', 'waiting', 'compensating')
                   AND r.due_at IS NOT NULL AND r.due_at <= statement_timestamp()
                   AND (p_workflows::text[] IS NULL OR r.workflow = ANY (p_workflows::text[])
                        OR r.workflow LIKE ANY (p_prefixes::text[]))
                   AND r.workflow <> ALL (v_full)
                 ORDER BY r.due_at LIMIT 1)
                UNION ALL
                SELECT 3, behind.flow_key, behind.workflow, behind.due_at FROM behind
            ) AS pair
            -- The key's name in its lock (length:workflow:flow key), and its
            -- workflow's place among the limited ones.
            CROSS JOIN LATERAL (
                SELECT length(pair.workflow) || ':' || pair.workflow || ':' || pair.flow_key AS id,
                       array_position(p_flow_workflows::text[], pair.workflow::text) AS limited
            ) AS key
            WHERE pair.due_at <= statement_timestamp()
              AND CASE
                  WHEN pair.flow_key IS NULL THEN NOT v_probing
                  WHEN NOT (p_workflows::text[] IS NULL
                            OR pair.workflow = ANY (p_workflows::text[])
                            OR pair.workflow LIKE ANY (p_prefixes::text[])) THEN false
                  WHEN pair.workflow = ANY (v_full) THEN false
                  WHEN p_key_caps[key.limited] IS NOT NULL
                       AND (SELECT count(*) FROM (
                                SELECT 1 FROM durable_run AS held
                                WHERE held.workflow = pair.workflow
                                  AND held.flow_key = pair.flow_key
                                  AND held.status IN ('running', 'compensating')
                                  AND held.lease_expires_at IS NOT NULL
                                LIMIT p_key_caps[key.limited]) AS busy)
                           >= p_key_caps[key.limited] THEN false
                  -- (A LIMIT 1 look-up, which the planner keeps per pair; an EXISTS
                  -- here it would turn into a hash of every resumed run.)
                  WHEN p_rates[key.limited] IS NOT NULL
                       AND (SELECT count(*) FROM (
                                SELECT 1 FROM durable_run AS begun
                                WHERE begun.workflow = pair.workflow
                                  AND begun.flow_key = pair.flow_key
                                  AND begun.started_at IS NOT NULL
                                  AND begun.started_at
                                      > statement_timestamp() - p_pers[key.limited]
                                LIMIT p_rates[key.limited]) AS begins)
                           >= p_rates[key.limited]
                       AND (SELECT true FROM durable_run AS r
                            WHERE r.queue = v_name
                              AND r.priority = (SELECT priority FROM level)
                              AND r.flow_key = pair.flow_key AND r.workflow = pair.workflow
                              AND r.status IN ('pending', 'waiting', 'compensating')
                              AND r.due_at IS NOT NULL AND r.due_at <= statement_timestamp()
                              AND r.started_at IS NOT NULL
                            LIMIT 1) IS NULL THEN false
                  WHEN v_probing THEN true
                  ELSE pg_try_advisory_xact_lock(
                      hashtextextended('django_durable.flow_key:' || key.id, 0))
                  END
            LIMIT (SELECT room FROM queue) - v_pos
        ) AS held
    ) AS got;
                IF v_pointer IS NULL AND NOT v_probing AND v_room > 0 THEN
                    v_room_queues := v_room_queues || v_name;  -- (its first level)
                    v_room_left := v_room_left || v_room;
                END IF;
                v_pointer := v_read_pointer;
                EXIT WHEN v_level IS NULL;  -- no level left, or no room
                IF v_probing THEN
                    -- The first key a claimer holds (the probe leaves out the runs
                    -- without a flow key: they need no lock).
                    v_skipped_id := v_got_ids[1];
                ELSE
                    v_n := cardinality(v_got_keys);
                    IF v_n > 0 THEN
                        v_queues := v_queues || array_fill(v_name, ARRAY[v_n]);
                        v_keys := v_keys || v_got_keys;
                        v_workflows := v_workflows || v_got_workflows;
                        v_levels := v_levels || array_fill(v_level, ARRAY[v_n]);
                        v_places := v_places || v_got_places;
                        v_pos := v_pos + v_n;
                    END IF;
                END IF;
                EXIT WHEN v_pos >= v_room OR v_skipped_id IS NOT NULL
                          OR v_level = -2147483648;
                v_bound := v_level - 1;
            END LOOP;
            EXIT WHEN v_skipped_id IS NOT NULL;
        END LOOP;
        EXIT WHEN cardinality(v_queues) > 0 OR v_waited;
        v_room_queues := '{}';
        v_room_left := '{}';
        IF NOT v_probing THEN
            v_probing := true;  -- the second pass: which key to wait for
        ELSE
            EXIT WHEN v_skipped_id IS NULL;  -- no key: nothing claimable
            -- (After the one-statement claim took nothing, only if it left no key
            -- locked: a key it found at its limit after the lock stays locked.)
            EXIT WHEN v_fast AND EXISTS (
                SELECT 1 FROM pg_locks
                WHERE locktype = 'advisory' AND mode = 'ExclusiveLock'
                  AND pid = pg_backend_pid());
            -- Wait for it, then read again (trying it again then succeeds: the lock is
            -- this transaction's).
            PERFORM pg_advisory_xact_lock(
                hashtextextended('django_durable.flow_key:' || v_skipped_id, 0));
            v_waited := true;
            v_probing := false;
            v_skipped_id := NULL;
        END IF;
    END LOOP;
    IF cardinality(v_queues) = 0 THEN
        RETURN;  -- nothing claimable
    END IF;

    -- How many due runs each key held can give (exact: a new statement, so a snapshot
    -- taken after the locks): its due runs at its level, at most p_limit, no more than
    -- concurrency_per_key leaves beside its running runs, and for a key with a rate
    -- its resumed due runs and no more new ones than may still begin; for a queue's
    -- runs without a flow key, its due ones of workflows below their workflow-wide
    -- limit.
    IF cardinality(v_queues) >= p_limit AND NOT v_rated THEN
        -- As many keys as the claim takes, none with a rate: one run of each (each has
        -- one due: step 3 saw it; step 5 checks each key's room again).
        v_avails := array_fill(1, ARRAY[cardinality(v_queues)]);
        v_resumeds := array_fill(NULL::integer, ARRAY[cardinality(v_queues)]);
    ELSE
    SELECT array_agg(LEAST(x.due, coalesce(l.key_cap - x.busy, x.due),
                           x.resumed + GREATEST(coalesce(l.rate - x.begins, x.due), 0))
                     ORDER BY c.n),
           array_agg(CASE WHEN l.rate IS NOT NULL THEN x.resumed END ORDER BY c.n)
    INTO v_avails, v_resumeds
    FROM unnest(v_queues, v_keys, v_workflows, v_levels) WITH ORDINALITY
        AS c(queue, flow_key, workflow, level, n)
    LEFT JOIN unnest(p_flow_workflows::text[], p_key_caps::integer[], p_rates::integer[],
                     p_pers::interval[]) AS l(workflow, key_cap, rate, per)
           ON l.workflow = c.workflow
    CROSS JOIN LATERAL (
        SELECT
            CASE WHEN c.flow_key IS NULL THEN (
                SELECT count(*) FROM (
                    SELECT 1 FROM durable_run AS r
                    WHERE r.queue = c.queue AND r.priority = c.level AND r.flow_key IS NULL
                      AND r.status IN ('pending', 'waiting', 'compensating')
                      AND r.due_at IS NOT NULL AND r.due_at <= statement_timestamp()
                      AND (p_workflows::text[] IS NULL OR r.workflow = ANY (p_workflows::text[])
                           OR r.workflow LIKE ANY (p_prefixes::text[]))
                      AND r.workflow <> ALL (v_full)
                    LIMIT p_limit) AS due)
            ELSE (
                SELECT count(*) FROM (
                    SELECT 1 FROM durable_run AS r
                    WHERE r.queue = c.queue AND r.priority = c.level
                      AND r.flow_key = c.flow_key AND r.workflow = c.workflow
                      AND r.status IN ('pending', 'waiting', 'compensating')
                      AND r.due_at IS NOT NULL AND r.due_at <= statement_timestamp()
                    LIMIT p_limit) AS due)
            END AS due,
            CASE WHEN l.key_cap IS NOT NULL THEN (
                SELECT count(*) FROM durable_run AS held
                WHERE held.workflow = c.workflow AND held.flow_key = c.flow_key
                  AND held.status IN ('running', 'compensating')
                  AND held.lease_expires_at IS NOT NULL)
            END AS busy,
            CASE WHEN l.rate IS NOT NULL THEN (
                SELECT count(*) FROM durable_run AS begun
                WHERE begun.workflow = c.workflow AND begun.flow_key = c.flow_key
                  AND begun.started_at IS NOT NULL
                  AND begun.started_at > statement_timestamp() - l.per)
            END AS begins,
            CASE WHEN l.rate IS NOT NULL THEN (
                SELECT count(*) FROM (
                    SELECT 1 FROM durable_run AS r
                    WHERE r.queue = c.queue AND r.priority = c.level
                      AND r.flow_key = c.flow_key AND r.workflow = c.workflow
                      AND r.status IN ('pending', 'waiting', 'compensating')
                      AND r.due_at IS NOT NULL AND r.due_at <= statement_timestamp()
                      AND r.started_at IS NOT NULL
                    LIMIT p_limit) AS resumed)
            ELSE 0 END AS resumed
    ) AS x;
    END IF;

    -- 4. How many runs each key gives: priority level by priority level, round by
    -- round (one run of every key held, in turn order, then a second...), within the
    -- room of its queue, of its workflow's workflow-wide limit and of the claim. When
    -- the claim holds p_limit keys, none with a rate and no workflow-wide limit, each
    -- gives its one run: no rounds to go.
    IF cardinality(v_queues) = p_limit AND NOT v_rated AND cardinality(v_capped) = 0 THEN
        v_allots := v_avails;
    ELSE
    SELECT array_agg(o.i ORDER BY v_levels[o.i] DESC, v_places[o.i], v_queues[o.i])
    INTO v_order
    FROM generate_subscripts(v_queues, 1) AS o(i);
    v_allots := array_fill(0, ARRAY[cardinality(v_queues)]);
    v_total := 0;
    v_first := 1;
    WHILE v_first <= cardinality(v_order) AND v_total < p_limit LOOP
        LOOP  -- rounds over the keys of the level of v_order[v_first]
            v_progress := false;
            FOR v_n IN v_first .. cardinality(v_order) LOOP
                v_i := v_order[v_n];
                EXIT WHEN v_levels[v_i] <> v_levels[v_order[v_first]] OR v_total >= p_limit;
                CONTINUE WHEN v_allots[v_i] >= v_avails[v_i];
                v_q := array_position(v_room_queues, v_queues[v_i]);
                CONTINUE WHEN v_room_left[v_q] <= 0;
                v_wf := CASE WHEN v_keys[v_i] IS NOT NULL
                             THEN array_position(v_capped, v_workflows[v_i]) END;
                CONTINUE WHEN v_wf IS NOT NULL AND v_capped_room[v_wf] <= 0;
                v_allots[v_i] := v_allots[v_i] + 1;
                v_total := v_total + 1;
                v_room_left[v_q] := v_room_left[v_q] - 1;
                IF v_wf IS NOT NULL THEN
                    v_capped_room[v_wf] := v_capped_room[v_wf] - 1;
                END IF;
                v_progress := true;
            END LOOP;
            EXIT WHEN NOT v_progress OR v_total >= p_limit;
        END LOOP;
        -- The next level.
        v_n := v_first;
        WHILE v_n <= cardinality(v_order)
              AND v_levels[v_order[v_n]] = v_levels[v_order[v_first]] LOOP
            v_n := v_n + 1;
        END LOOP;
        v_first := v_n;
    END LOOP;
    END IF;

    -- The database's clock, after the locks.
    v_now := clock_timestamp();

    -- 5. The claim: each key's share of its due runs at its level, in due order, locked
    -- FOR UPDATE SKIP LOCKED (a run a claimer of an older release took since is
    -- skipped; this release's claimers take only keys they hold). A key with a rate
    -- gives its resumed runs first, then no more new ones than may begin. The runs
    -- without a flow key are kept within what their workflows' workflow-wide limits
    -- leave. The queue's pointer moves to the key, at the highest level taken, that
    -- comes last in turn order (one upsert per queue).
    RETURN QUERY
WITH given AS (
    SELECT c.*
    FROM unnest(v_queues, v_keys, v_workflows, v_levels, v_places, v_allots, v_resumeds)
        AS c(queue, flow_key, workflow, level, place, allot, resumed)
    WHERE c.allot > 0
),
-- Each key's share, within the room concurrency_per_key leaves (counted again here:
-- step 4's counts may be step 3's).
chosen AS (
    SELECT given.queue, given.flow_key, given.workflow, given.level, given.place,
           x.allot,
           CASE WHEN given.resumed IS NOT NULL THEN LEAST(x.allot, given.resumed) END
               AS from_resumed
    FROM given
    LEFT JOIN unnest(p_flow_workflows::text[], p_key_caps::integer[]) AS l(workflow, key_cap)
           ON l.workflow = given.workflow
    CROSS JOIN LATERAL (
        SELECT CASE WHEN l.key_cap IS NULL THEN given.allot
                    ELSE GREATEST(LEAST(given.allot, l.key_cap - (
                        SELECT count(*) FROM durable_run AS held
                        WHERE held.workflow = given.workflow AND held.flow_key = given.flow_key
                          AND held.status IN ('running', 'compensating')
                          AND held.lease_expires_at IS NOT NULL)), 0)
               END AS allot
    ) AS x
),
taken AS MATERIALIZED (
    SELECT c.id, chosen.queue, chosen.flow_key, chosen.level, chosen.place
    FROM chosen
    CROSS JOIN LATERAL (
        SELECT r.id FROM durable_run AS r
        WHERE r.queue = chosen.queue AND r.priority = chosen.level
          AND r.flow_key = chosen.flow_key AND r.workflow = chosen.workflow
          AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
          AND r.due_at <= v_now
        ORDER BY r.due_at, r.id
        LIMIT chosen.allot
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE chosen.flow_key IS NOT NULL AND chosen.from_resumed IS NULL
    UNION ALL
    SELECT c.id, chosen.queue, chosen.flow_key, chosen.level, chosen.place
    FROM chosen
    CROSS JOIN LATERAL (
        SELECT r.id FROM durable_run AS r
        WHERE r.queue = chosen.queue AND r.priority = chosen.level
          AND r.flow_key = chosen.flow_key AND r.workflow = chosen.workflow
          AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
          AND r.due_at <= v_now
          AND (chosen.from_resumed IS NULL OR r.started_at IS NOT NULL)
        ORDER BY r.due_at, r.id
        LIMIT chosen.from_resumed
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE chosen.flow_key IS NOT NULL AND chosen.from_resumed > 0
    UNION ALL
    SELECT c.id, chosen.queue, chosen.flow_key, chosen.level, chosen.place
    FROM chosen
    CROSS JOIN LATERAL (
        SELECT r.id FROM durable_run AS r
        WHERE r.queue = chosen.queue AND r.priority = chosen.level
          AND r.flow_key = chosen.flow_key AND r.workflow = chosen.workflow
          AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
          AND r.due_at <= v_now
          AND r.started_at IS NULL
        ORDER BY r.due_at, r.id
        LIMIT chosen.allot - chosen.from_resumed
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE chosen.flow_key IS NOT NULL AND chosen.allot > chosen.from_resumed
    UNION ALL
    SELECT unkeyed.id, unkeyed.queue, NULL, unkeyed.level, unkeyed.place
    FROM (
        SELECT c.id, chosen.queue, chosen.level, chosen.place, c.workflow,
               row_number() OVER (PARTITION BY c.workflow ORDER BY c.due_at) AS k
        FROM chosen
        CROSS JOIN LATERAL (
            SELECT r.id, r.workflow, r.due_at FROM durable_run AS r
            WHERE r.queue = chosen.queue AND r.priority = chosen.level
              AND r.flow_key IS NULL
              AND r.status IN ('pending', 'waiting', 'compensating')
              AND r.due_at IS NOT NULL AND r.due_at <= v_now
              AND (p_workflows::text[] IS NULL OR r.workflow = ANY (p_workflows::text[])
                   OR r.workflow LIKE ANY (p_prefixes::text[]))
              AND r.workflow <> ALL (v_full)
            ORDER BY r.due_at
            LIMIT chosen.allot
            FOR UPDATE SKIP LOCKED
        ) AS c
        WHERE chosen.flow_key IS NULL
    ) AS unkeyed
    LEFT JOIN unnest(v_capped, v_capped_room) AS room(workflow, left_)
           ON room.workflow = unkeyed.workflow
    WHERE room.left_ IS NULL OR unkeyed.k <= room.left_
),
turned AS (
    INSERT INTO durable_flow_turn AS turn (queue, flow_key, claimed_at)
    SELECT DISTINCT ON (taken.queue) taken.queue, COALESCE(taken.flow_key, ''), v_now
    FROM taken
    ORDER BY taken.queue, taken.level DESC, taken.place DESC
    ON CONFLICT (queue, flow_key) DO UPDATE SET claimed_at = EXCLUDED.claimed_at
)
UPDATE durable_run SET
    status = CASE WHEN status = 'compensating' THEN 'compensating' ELSE 'running' END,
    due_at = CASE WHEN status = 'compensating' THEN NULL ELSE durable_run.due_at END,
    worker_id = p_worker,
    lease_expires_at = v_now + p_lease,
    fence = fence + 1,
    started_at = COALESCE(started_at, v_now)
WHERE durable_run.id = ANY (ARRAY(SELECT id FROM taken))
RETURNING durable_run.*;
END
$claim$;
