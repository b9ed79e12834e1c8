-- durable_claim_v3: a worker's claim of up to p_limit due runs, in one call (one round
-- trip), with flow control by key (docs/flow-control.md). Created by migration 0004; never
-- edited: a change is a durable_claim_v4 beside it, in a new migration
-- (docs/production.md, "Upgrading"). durable_claim_v2 and durable_claim_v1 stay
-- beside it for the previous releases' workers during a rolling deploy.
--
-- Arguments: those of durable_claim_v2 (the same call under a new name).
--
-- Two paths, chosen as by v2. When no claimable run of the served queues has a flow
-- key, and none belongs to a workflow with a workflow-wide limit, the claim is
-- durable_claim_v1's statement, unchanged. The probe that decides reads
-- durable_run_flow in its own order, so that no plan reads the table for it (v2's
-- EXISTS could: 1.5-2 ms a claim once 8,000 runs had finished).
--
-- Otherwise (the flow path). What changed from v2, which read every key with
-- claimable runs at every claim (a claim of 2,000 keys took 147 ms), serialised every
-- claimer of a limited workflow on one lock whether or not it had a run due, and
-- locked a claim's worth of runs of every key to rank them (80 row locks to claim 4
-- runs of 20 keys): v3 reads about as many keys as it claims from, takes the keys no
-- other claimer is claiming from (SKIP LOCKED, one level up), and locks only the runs
-- it takes.
-- 1. The workflow locks, in name order, waiting: exclusive for a workflow with a
--    workflow-wide limit that has a claimable run (concurrency counts every key, so
--    its claimers take turns, as in v2), shared for one with per-key limits only.
--    The shared lock only keeps a v3 claimer out while a v2 claimer, which takes it
--    exclusive, counts during a rolling deploy. Then the room each workflow-wide
--    limit leaves (counted after its lock: exact), and, for step 2 to leave out keys
--    at a limit, the running runs and the begins in the window per key of the
--    workflows with per-key limits.
-- 2. The keys, per open queue, in turns: priority level by priority level (the
--    highest with a due run first: one walk of durable_run_claim, as v1's), the
--    level's (flow key, workflow) pairs by a loose index scan of
--    durable_run_flow_level that starts after the queue's pointer (the flow key the
--    queue's last claim took last: the newest row of durable_flow_turn, through
--    durable_flow_turn_last), then the level's runs without a flow key (as one more
--    key), then the pairs up to the pointer. The scan is read one pair at a time, so a
--    claim reads about as many pairs as it takes, however many keys have runs. A pair
--    is left out when it has no due run at that level, when its workflow is not
--    served or is at its workflow-wide limit, or when its key is at a limit by the
--    counts of step 1 (one at its rate stays when it has a resumed run due: the rate
--    counts begins only). Otherwise the claimer tries the key's transaction-level
--    advisory lock (per workflow and flow key) without waiting, skips a key another
--    claimer holds, and stops once it holds as many keys as the queue has room. One
--    that holds no key at the end waits for the first it skipped, then reads again,
--    so no claimer comes back empty while a run is claimable. It waits for a key only
--    when it holds none, and takes workflow locks only before keys: no two claimers
--    wait on each other in a cycle.
-- 3. How many runs each key held gives: priority level by priority level, round by
--    round (one run of every key in turn order, then a second...), within its queue's
--    room, its workflow's workflow-wide room and p_limit. When the claim holds p_limit
--    keys and none has a rate, each gives one; otherwise a statement counts, after the
--    locks, what each can give (due runs at its level, the room concurrency_per_key
--    leaves, and for a rate its resumed due runs and the begins left).
-- 4. v_now, the database's clock, read after the locks.
-- 5. The claim, a new statement, so a snapshot taken after the locks: each key's
--    share, within the room concurrency_per_key leaves counted again here (exact: the
--    previous holder of the key's lock committed before this snapshot), of its due
--    runs at its level in due order, locked FOR UPDATE SKIP LOCKED (a run a claimer
--    of an older release took since is skipped); a key with a rate gives its resumed
--    runs first, then no more new ones than may begin (through
--    durable_run_flow_begun). The runs without a flow key are kept within what their
--    workflows' workflow-wide limits leave. They are claimed as by v1, and the queue's
--    pointer moves to the key, at the highest level taken, last in turn order (one
--    upsert per queue).
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
CREATE OR REPLACE FUNCTION durable_claim_v3(
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
    v_queue record;
    v_pairs refcursor;
    v_level integer;
    v_pos integer;
    v_limit integer;
    -- A key's name in the counts and in its advisory lock: length:workflow:flow key.
    v_id text;
    v_b integer;
    -- The counts read before the loop (step 2's filter): running runs per key of a
    -- workflow with concurrency_per_key, begins in the window per key with a rate.
    v_busy_keys text[] := '{}';
    v_busy_n bigint[] := '{}';
    v_begun_keys text[] := '{}';
    v_begun_n bigint[] := '{}';
    -- The workflows with a workflow-wide limit whose lock this claimer holds, the room
    -- each leaves, and those at their limit.
    v_capped text[] := '{}';
    v_capped_room integer[] := '{}';
    v_full text[] := '{}';
    -- The keys this claimer holds (step 2), in turn order per queue and level: (queue,
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
    -- Step 3: the keys in order, each one's share, and the loop's state.
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

    -- The running runs of each key of a workflow with concurrency_per_key, and the
    -- begins in the window of each key of a workflow with rate_per_key, as the loop
    -- below reads them to leave out keys at a limit (keyed by length:workflow:key).
    SELECT coalesce(array_agg(length(b.workflow) || ':' || b.workflow || ':' || b.flow_key), '{}'),
           coalesce(array_agg(b.n), '{}')
    INTO v_busy_keys, v_busy_n
    FROM (SELECT held.workflow, held.flow_key, count(*) AS n
          FROM durable_run AS held
          JOIN unnest(p_flow_workflows::text[], p_key_caps::integer[]) AS l(workflow, key_cap)
            ON l.workflow = held.workflow AND l.key_cap IS NOT NULL
          WHERE held.flow_key IS NOT NULL
            AND held.status IN ('running', 'compensating') AND held.lease_expires_at IS NOT NULL
          GROUP BY held.workflow, held.flow_key) AS b;
    IF EXISTS (SELECT 1 FROM unnest(p_rates::integer[]) AS rate WHERE rate IS NOT NULL) THEN
        SELECT coalesce(array_agg(length(b.workflow) || ':' || b.workflow || ':' || b.flow_key), '{}'),
               coalesce(array_agg(b.n), '{}')
        INTO v_begun_keys, v_begun_n
        FROM (SELECT begun.workflow, begun.flow_key, count(*) AS n
              FROM unnest(p_flow_workflows::text[], p_rates::integer[], p_pers::interval[])
                  AS l(workflow, rate, per)
              JOIN durable_run AS begun
                ON begun.workflow = l.workflow AND begun.flow_key IS NOT NULL
               AND begun.started_at IS NOT NULL
               AND begun.started_at > statement_timestamp() - l.per
              WHERE l.rate IS NOT NULL
              GROUP BY begun.workflow, begun.flow_key) AS b;
    END IF;

    -- 2. The keys, per open queue: priority level by priority level, in turns from the
    -- queue's pointer; each tried without waiting, then its room counted. A second
    -- pass only when the first held no key: it waits for the first key skipped.
    LOOP
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
            v_room_queues := v_room_queues || v_queue.name;
            v_room_left := v_room_left || v_queue.room;
            v_pos := 0;
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
                -- durable_run_flow_level, one probe per pair, read as the loop goes).
                OPEN v_pairs FOR
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
    (SELECT behind.flow_key, behind.workflow, behind.due_at FROM behind);
                LOOP
                    FETCH v_pairs INTO v_row;  -- one at a time: read only what is used
                    EXIT WHEN NOT FOUND;
                    -- A pair is skipped when it has no due run at this level, or when
                    -- its workflow is not served or is at its workflow-wide limit.
                    CONTINUE WHEN v_row.due_at > statement_timestamp();
                    IF v_row.flow_key IS NOT NULL THEN
                        CONTINUE WHEN NOT (p_workflows::text[] IS NULL
                                           OR v_row.workflow = ANY (p_workflows::text[])
                                           OR v_row.workflow LIKE ANY (p_prefixes::text[]));
                        CONTINUE WHEN v_row.workflow = ANY (v_full);
                        v_id := length(v_row.workflow) || ':' || v_row.workflow || ':'
                                || v_row.flow_key;
                        -- At a limit by the counts read before the loop? (They only
                        -- leave keys out; step 3 counts again after the locks.)
                        v_limit := array_position(p_flow_workflows::text[], v_row.workflow);
                        IF v_limit IS NOT NULL THEN
                            v_b := array_position(v_busy_keys, v_id);
                            CONTINUE WHEN p_key_caps[v_limit] <= v_busy_n[v_b];
                            v_b := array_position(v_begun_keys, v_id);
                            -- (A key at its rate stays when it has a resumed run due:
                            -- the rate counts begins only.)
                            IF p_rates[v_limit] <= v_begun_n[v_b] THEN
                                CONTINUE WHEN NOT EXISTS (
                                    SELECT 1 FROM durable_run AS r
                                    WHERE r.queue = v_queue.name AND r.priority = v_level
                                      AND r.flow_key = v_row.flow_key
                                      AND r.workflow = v_row.workflow
                                      AND r.status IN ('pending', 'waiting', 'compensating')
                                      AND r.due_at IS NOT NULL
                                      AND r.due_at <= statement_timestamp()
                                      AND r.started_at IS NOT NULL);
                            END IF;
                        END IF;
                        IF NOT pg_try_advisory_xact_lock(
                               hashtextextended('django_durable.flow_key:' || v_id, 0)) THEN
                            v_skipped_id := coalesce(v_skipped_id, v_id);
                            CONTINUE;
                        END IF;
                    END IF;
                    v_pos := v_pos + 1;
                    v_queues := v_queues || v_queue.name;
                    v_keys := v_keys || v_row.flow_key;
                    v_workflows := v_workflows || v_row.workflow;
                    v_levels := v_levels || v_level;
                    v_places := v_places || v_pos;
                    EXIT WHEN v_pos >= v_queue.room;
                END LOOP;
                CLOSE v_pairs;
                EXIT WHEN v_pos >= v_queue.room;
            END LOOP;
        END LOOP;
        EXIT WHEN cardinality(v_queues) > 0 OR v_skipped_id IS NULL OR v_waited;
        -- No key held: wait for the first one skipped, then read again (trying it
        -- again then succeeds: the lock is this transaction's).
        PERFORM pg_advisory_xact_lock(hashtextextended('django_durable.flow_key:' || v_skipped_id, 0));
        v_waited := true;
        v_skipped_id := NULL;
        v_room_queues := '{}';
        v_room_left := '{}';
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
    IF cardinality(v_queues) >= p_limit AND NOT EXISTS (
           SELECT 1 FROM unnest(p_flow_workflows::text[], p_rates::integer[]) AS l(workflow, rate)
           WHERE l.rate IS NOT NULL AND l.workflow = ANY (v_workflows)) THEN
        -- As many keys as the claim takes, none with a rate: one run of each (each has
        -- one due: step 2 saw it; step 5 checks each key's room again).
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

    -- 3. How many runs each key gives: priority level by priority level, round by
    -- round (one run of every key held, in turn order, then a second...), within the
    -- room of its queue, of its workflow's workflow-wide limit and of the claim.
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

    -- 4. The database's clock, after the locks.
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
-- step 3's counts may be step 2's).
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
          AND (chosen.from_resumed IS NULL OR r.started_at IS NOT NULL)
        ORDER BY r.due_at, r.id
        LIMIT COALESCE(chosen.from_resumed, chosen.allot)
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE chosen.flow_key IS NOT NULL
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
