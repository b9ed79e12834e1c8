-- durable_claim_v5: a worker's claim of up to p_limit due runs, in one call (one round
-- trip), with every limit (docs/flow-control.md). Created by migration 0006.
--
-- The limits hold by database rule: a claimed run of a limited scope (a queue's
-- concurrency, a workflow's concurrency, a flow key's concurrency_per_key) takes a
-- free slot number in [0, limit), and the partial unique indexes durable_run_queue_slot,
-- durable_run_workflow_slot and durable_run_flow_slot refuse a second run holding a
-- worker with the same slot; a begin of a key with rate_per_key takes a rate slot by a
-- conditional upsert (durable_flow_rate_slot). Whatever the isolation level, two
-- claimers cannot go past a limit: the second one's write fails.
-- This function makes that refusal rare: it serialises per scope with advisory locks
-- (a queue's and a workflow's waited for, in name order; a flow key's tried, a key
-- held elsewhere skipped), then counts each scope's runs on a snapshot taken after the
-- lock (a new statement, at READ COMMITTED: the store sets that level for the claim).
-- A scope with as many running runs as its limit, or more (a lowered limit), gives
-- nothing; the others go on.
--
-- 1. The open queues served (p_queues, or every queue with a claimable run, by a loose
--    scan of durable_run_claim) and the limited ones' locks; 2. each one's room, and
--    the gate: the fast path when no run due in them has a flow key and none of a
--    workflow with a workflow-wide limit is due (gated on due, not claimable: runs
--    sleeping until later cost nothing). 3. Fast path: per queue its room of due runs
--    in claim order (durable_run_claim), FOR UPDATE SKIP LOCKED. 4. Flow path: the
--    workflow locks and rooms; per queue, the (flow key, workflow) pairs in turns from
--    the queue's pointer (the key its last claim took last: a loose scan of
--    durable_run_flow, key order, wrapping), those with a due run, room and a lock,
--    up to the queue's room; the runs without a flow key are one more pair, in the
--    turn of key ''. Then one statement takes their due runs and counts each key's
--    room once (after the locks), whatever levels and queues its runs are in: a key's
--    runs by priority then due time within its room and its begins within its free
--    rate slots, then claim order (priority, round, turn) within each queue's and
--    workflow's room and p_limit. The rate slots are taken (a begin whose slot was
--    taken meanwhile is dropped), the queue's pointer moves. 5. The claim: every
--    claimed run gets its slots (the n-th free one of each limited scope) and is
--    claimed by one UPDATE. A compensating run stays compensating.
--
-- Plans are kept for the session ("force_generic_plan"), "jit = off" (the generic cost
-- is above jit_above_cost) and "enable_incremental_sort = off" (a key's runs are read
-- in durable_run_flow's order, not sorted from durable_run_claim behind a backlog).
CREATE OR REPLACE FUNCTION durable_claim_v5(
    p_queues text[], p_limit integer, p_limited text[], p_caps integer[],
    p_workflows text[], p_prefixes text[], p_worker varchar, p_lease interval,
    p_flow_workflows text[], p_key_caps integer[], p_flow_caps integer[],
    p_rates integer[], p_pers interval[]
) RETURNS TABLE (
    id uuid, workflow varchar, queue varchar, status varchar, priority integer,
    input jsonb, context jsonb, result jsonb, error jsonb, "key" varchar,
    holds_key boolean, runs_after_id uuid, parent_id uuid, step_index integer,
    attempt integer, due_at timestamptz, timeout_at timestamptz,
    debounce_deadline timestamptz, waiting_for varchar, state jsonb, worker_id varchar,
    lease_expires_at timestamptz, fence integer, recoveries integer, step_names jsonb,
    trace_context jsonb, created_at timestamptz, started_at timestamptz,
    finished_at timestamptz, rerun_of_id uuid, rerun_from_step varchar, inputs jsonb,
    flow_key varchar, flow_slot smallint, workflow_slot smallint, queue_slot smallint
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_incremental_sort = off
AS $claim$
#variable_conflict use_column
DECLARE
    v_now timestamptz := statement_timestamp();
    v_open text[];          -- the open queues served, in name order
    v_room integer[];       -- each one's room
    v_capped text[];        -- the workflows with a workflow-wide limit and a due run
    v_flow boolean;
    v_name text;
    v_left integer;
    v_pointer text;
    -- The pairs taken, in turn order per queue: queue, flow key (NULL: the runs
    -- without one), workflow, place in the queue's turn.
    v_pq text[] := '{}';  v_pk text[] := '{}';  v_pw text[] := '{}';  v_place numeric[] := '{}';
    v_ids uuid[];
    v_rate_slots integer[];  -- per claimed id, the rate slot of a begin (else NULL)
BEGIN
    SELECT array_agg(s.name ORDER BY s.name) INTO v_open FROM (
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
            FROM served WHERE p_queues::text[] IS NULL AND served.name IS NOT NULL
        )
        SELECT served.name FROM served WHERE served.name IS NOT NULL
          AND NOT COALESCE((SELECT q.paused FROM durable_queue AS q WHERE q.name = served.name), false)
    ) AS s;
    IF v_open IS NULL THEN RETURN; END IF;
    FOR v_name IN SELECT o FROM unnest(v_open) AS o WHERE o = ANY (p_limited) ORDER BY o LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('django_durable.queue:' || v_name, 0));
    END LOOP;
    -- After the locks: a new statement, a new snapshot (READ COMMITTED).
    SELECT array_agg(CASE WHEN lim.cap IS NULL THEN p_limit ELSE GREATEST(lim.cap - (
               SELECT count(*) FROM durable_run AS h WHERE h.queue = o.name
                  AND h.status IN ('running', 'compensating') AND h.lease_expires_at IS NOT NULL), 0)
           END ORDER BY o.name)
    INTO v_room
    FROM unnest(v_open) AS o(name) LEFT JOIN unnest(p_limited, p_caps) AS lim(name, cap) USING (name);
    v_capped := ARRAY(
        SELECT f.name FROM unnest(p_flow_workflows, p_flow_caps) AS f(name, cap)
        WHERE f.cap IS NOT NULL AND EXISTS (
            SELECT 1 FROM durable_run AS r
            WHERE r.workflow = f.name AND r.status IN ('pending', 'waiting', 'compensating')
              AND r.due_at IS NOT NULL AND r.due_at <= v_now AND r.queue = ANY (v_open))
        ORDER BY f.name);
    v_flow := cardinality(v_capped) > 0 OR EXISTS (
        SELECT 1 FROM unnest(v_open, v_room) AS o(name, room) WHERE o.room > 0 AND EXISTS (
            SELECT 1 FROM durable_run AS r
            WHERE r.queue = o.name AND r.status IN ('pending', 'waiting', 'compensating')
              AND r.due_at IS NOT NULL AND r.flow_key IS NOT NULL AND r.due_at <= v_now));
    IF NOT v_flow THEN
        v_ids := ARRAY(
            SELECT p.id FROM unnest(v_open, v_room) AS o(name, room) CROSS JOIN LATERAL (
                SELECT r.id, r.priority, r.due_at FROM durable_run AS r
                WHERE r.queue = o.name
                  AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
                  AND r.due_at <= v_now
                  AND (p_workflows IS NULL OR r.workflow = ANY (p_workflows) OR r.workflow LIKE ANY (p_prefixes))
                ORDER BY r.priority DESC, r.due_at LIMIT LEAST(o.room, p_limit)
                FOR UPDATE SKIP LOCKED) AS p
            ORDER BY p.priority DESC, p.due_at LIMIT p_limit);
    ELSE
        FOREACH v_name IN ARRAY v_capped LOOP
            PERFORM pg_advisory_xact_lock(hashtextextended('django_durable.workflow:' || v_name, 0));
        END LOOP;
        FOR v_name, v_left IN SELECT * FROM unnest(v_open, v_room) AS o(name, room) WHERE o.room > 0 LOOP
            v_pointer := (SELECT t.flow_key FROM durable_flow_turn AS t WHERE t.queue = v_name
                          ORDER BY t.claimed_at DESC LIMIT 1);
            WITH RECURSIVE walk(flow_key, workflow, wrapped, n) AS (
                (SELECT s.*, 1 FROM ((SELECT r.flow_key, r.workflow, false FROM durable_run AS r
                      WHERE r.queue = v_name AND r.flow_key > v_pointer
                        AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
                        AND r.flow_key IS NOT NULL ORDER BY r.flow_key, r.workflow LIMIT 1)
                     UNION ALL
                     (SELECT r.flow_key, r.workflow, true FROM durable_run AS r WHERE r.queue = v_name
                        AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
                        AND r.flow_key IS NOT NULL ORDER BY r.flow_key, r.workflow LIMIT 1)
                     LIMIT 1) AS s)
                UNION ALL
                SELECT nxt.*, walk.n + 1 FROM walk CROSS JOIN LATERAL (
                    (SELECT r.flow_key, r.workflow, walk.wrapped FROM durable_run AS r
                     WHERE r.queue = v_name AND (r.flow_key, r.workflow) > (walk.flow_key, walk.workflow)
                       AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
                       AND r.flow_key IS NOT NULL ORDER BY r.flow_key, r.workflow LIMIT 1)
                    UNION ALL
                    (SELECT r.flow_key, r.workflow, true FROM durable_run AS r
                     WHERE NOT walk.wrapped AND r.queue = v_name
                       AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
                       AND r.flow_key IS NOT NULL ORDER BY r.flow_key, r.workflow LIMIT 1)
                    LIMIT 1) AS nxt
                WHERE v_pointer IS NULL OR NOT (nxt.wrapped AND nxt.flow_key > v_pointer)
            ),
            taken AS (
                SELECT walk.* FROM walk LEFT JOIN unnest(p_flow_workflows, p_key_caps, p_rates, p_pers)
                       AS l(workflow, key_cap, rate, per) USING (workflow)
                WHERE CASE  -- in this order: the lock is tried last
                    WHEN NOT (p_workflows IS NULL OR walk.workflow = ANY (p_workflows)
                              OR walk.workflow LIKE ANY (p_prefixes)) THEN false
                    WHEN (SELECT r.id FROM durable_run AS r WHERE r.queue = v_name  -- a due run
                            AND r.flow_key = walk.flow_key AND r.workflow = walk.workflow
                            AND r.status IN ('pending', 'waiting', 'compensating')
                            AND r.due_at IS NOT NULL AND r.flow_key IS NOT NULL AND r.due_at <= v_now
                          ORDER BY r.priority DESC, r.due_at, r.id LIMIT 1) IS NULL THEN false
                    WHEN l.key_cap IS NULL AND l.rate IS NULL THEN true
                    ELSE pg_try_advisory_xact_lock(hashtextextended('django_durable.flow_key:'
                         || length(walk.workflow) || ':' || walk.workflow || ':' || walk.flow_key, 0))
                    END
                LIMIT LEAST(v_left, p_limit)  -- no ORDER BY: the walk is read only this far
            )
            SELECT v_pq || array_agg(v_name), v_pk || array_agg(k), v_pw || array_agg(w),
                   v_place || array_agg(place)
            INTO v_pq, v_pk, v_pw, v_place
            FROM (SELECT taken.flow_key, taken.workflow, taken.n::numeric FROM taken
                  UNION ALL  -- the runs without a flow key: in the turn of key '', at the wrap
                  SELECT NULL, NULL, COALESCE((SELECT min(n) FROM taken WHERE wrapped),
                                              (SELECT max(n) + 1 FROM taken), 1) - 0.5
                 ) AS x(k, w, place);
        END LOOP;
        -- After the locks: what each pair gives, each key's room counted once.
        WITH pair AS (SELECT * FROM unnest(v_pq, v_pk, v_pw, v_place) AS p(queue, flow_key, workflow, place)),
        lim AS (SELECT * FROM unnest(p_flow_workflows, p_key_caps, p_flow_caps, p_rates, p_pers)
                AS l(workflow, key_cap, cap, rate, per)),
        cand AS MATERIALIZED (
            SELECT c.*, pair.place FROM pair CROSS JOIN LATERAL (
                SELECT r.id, r.queue, r.workflow, r.flow_key, r.priority, r.due_at, r.started_at
                FROM durable_run AS r
                WHERE pair.flow_key IS NOT NULL AND r.queue = pair.queue
                  AND r.flow_key = pair.flow_key AND r.workflow = pair.workflow
                  AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
                  AND r.flow_key IS NOT NULL AND r.due_at <= v_now
                ORDER BY r.priority DESC, r.due_at, r.id LIMIT p_limit FOR UPDATE SKIP LOCKED) AS c
            UNION ALL
            SELECT c.*, pair.place FROM pair CROSS JOIN LATERAL (
                SELECT r.id, r.queue, r.workflow, r.flow_key, r.priority, r.due_at, r.started_at
                FROM durable_run AS r
                WHERE pair.flow_key IS NULL AND r.queue = pair.queue
                  AND r.status IN ('pending', 'waiting', 'compensating') AND r.due_at IS NOT NULL
                  AND r.flow_key IS NULL AND r.due_at <= v_now
                  AND (p_workflows IS NULL OR r.workflow = ANY (p_workflows) OR r.workflow LIKE ANY (p_prefixes))
                ORDER BY r.priority DESC, r.due_at LIMIT p_limit FOR UPDATE SKIP LOCKED) AS c
        ),
        key_room AS (
            SELECT k.workflow, k.flow_key,
                   CASE WHEN lim.key_cap IS NOT NULL THEN GREATEST(lim.key_cap - (
                       SELECT count(*) FROM durable_run AS h
                       WHERE h.workflow = k.workflow AND h.flow_key = k.flow_key
                         AND h.status IN ('running', 'compensating') AND h.lease_expires_at IS NOT NULL), 0)
                   END AS runs,
                   CASE WHEN lim.rate IS NOT NULL THEN ARRAY(
                       SELECT s FROM generate_series(0, lim.rate - 1) AS s WHERE NOT EXISTS (
                           SELECT 1 FROM durable_flow_rate_slot AS b WHERE b.workflow = k.workflow
                              AND b.flow_key = k.flow_key AND b.slot = s AND b.begun_at > v_now - lim.per)
                       ORDER BY s)
                   END AS free_rate
            FROM (SELECT DISTINCT workflow, flow_key FROM cand WHERE flow_key IS NOT NULL) AS k
            JOIN lim USING (workflow)
        ),
        ranked AS (
            SELECT cand.*, kr.runs, kr.free_rate, cand.started_at IS NULL AND kr.free_rate IS NOT NULL AS begins,
                   row_number() OVER (PARTITION BY cand.workflow, cand.flow_key
                                      ORDER BY cand.priority DESC, cand.due_at, cand.id) AS key_n,
                   row_number() OVER (PARTITION BY cand.workflow, cand.flow_key, cand.started_at IS NULL
                                      ORDER BY cand.priority DESC, cand.due_at, cand.id) AS begin_n,
                   row_number() OVER (PARTITION BY cand.queue, cand.place
                                      ORDER BY cand.priority DESC, cand.due_at, cand.id) AS round
            FROM cand LEFT JOIN key_room AS kr
              ON kr.workflow = cand.workflow AND kr.flow_key = cand.flow_key
        ),
        kept AS (
            SELECT ranked.*,
                   row_number() OVER (PARTITION BY ranked.queue ORDER BY ranked.priority DESC,
                                      ranked.round, ranked.place, ranked.due_at) AS queue_n,
                   row_number() OVER (PARTITION BY ranked.workflow ORDER BY ranked.priority DESC,
                                      ranked.round, ranked.place, ranked.due_at) AS workflow_n
            FROM ranked
            WHERE (ranked.runs IS NULL OR ranked.key_n <= ranked.runs)
              AND (NOT ranked.begins OR ranked.begin_n <= cardinality(ranked.free_rate))
        ),
        claimed AS (
            SELECT kept.* FROM kept
            JOIN unnest(v_open, v_room) AS o(name, room) ON o.name = kept.queue
            LEFT JOIN (SELECT l.workflow, GREATEST(l.cap - (SELECT count(*) FROM durable_run AS h
                           WHERE h.workflow = l.workflow AND h.status IN ('running', 'compensating')
                             AND h.lease_expires_at IS NOT NULL), 0) AS room
                       FROM lim AS l WHERE l.workflow = ANY (v_capped)) AS w ON w.workflow = kept.workflow
            WHERE kept.queue_n <= o.room AND (w.room IS NULL OR kept.workflow_n <= w.room)
            ORDER BY kept.priority DESC, kept.round, kept.place, kept.due_at LIMIT p_limit
        ),
        turned AS (  -- the queue's pointer: the key it took last, at its highest level
            INSERT INTO durable_flow_turn AS turn (queue, flow_key, claimed_at)
            SELECT DISTINCT ON (claimed.queue) claimed.queue, COALESCE(claimed.flow_key, ''), v_now
            FROM claimed ORDER BY claimed.queue, claimed.priority DESC, claimed.round DESC, claimed.place DESC
            ON CONFLICT (queue, flow_key) DO UPDATE SET claimed_at = EXCLUDED.claimed_at
        )
        SELECT array_agg(claimed.id),
               array_agg(CASE WHEN claimed.begins THEN claimed.free_rate[claimed.begin_n] END)
        INTO v_ids, v_rate_slots FROM claimed;
        -- The begins' rate slots: a slot begun in the window meanwhile refuses, and its
        -- begin is dropped (at REPEATABLE READ the concurrent update fails instead).
        WITH taken AS (
            INSERT INTO durable_flow_rate_slot AS b (workflow, flow_key, slot, begun_at)
            SELECT r.workflow, r.flow_key, c.slot, v_now
            FROM unnest(v_ids, v_rate_slots) AS c(id, slot) JOIN durable_run AS r ON r.id = c.id
            WHERE c.slot IS NOT NULL
            ON CONFLICT (workflow, flow_key, slot) DO UPDATE SET begun_at = EXCLUDED.begun_at
            WHERE b.begun_at <= v_now - (SELECT l.per FROM unnest(p_flow_workflows, p_pers) AS l(workflow, per)
                                         WHERE l.workflow = b.workflow)
            RETURNING b.workflow, b.flow_key, b.slot
        )
        SELECT array_agg(c.id) INTO v_ids
        FROM unnest(v_ids, v_rate_slots) AS c(id, slot) JOIN durable_run AS r ON r.id = c.id
        WHERE c.slot IS NULL OR EXISTS (SELECT 1 FROM taken AS t WHERE t.workflow = r.workflow
                                        AND t.flow_key = r.flow_key AND t.slot = c.slot);
    END IF;
    IF v_ids IS NULL OR cardinality(v_ids) = 0 THEN RETURN; END IF;
    -- The claim: each run's slot in each limited scope, the n-th free one of the scope.
    RETURN QUERY
    WITH run AS (SELECT r.id, r.queue, r.workflow, r.flow_key FROM durable_run AS r WHERE r.id = ANY (v_ids)),
    scoped AS (
        SELECT run.id, 1 AS kind, run.queue AS scope, NULL::varchar AS flow_key, lim.cap
        FROM run JOIN unnest(p_limited, p_caps) AS lim(name, cap) ON lim.name = run.queue
        UNION ALL
        SELECT run.id, 2, run.workflow, NULL, lim.cap
        FROM run JOIN unnest(p_flow_workflows, p_flow_caps) AS lim(name, cap) ON lim.name = run.workflow
        WHERE lim.cap IS NOT NULL
        UNION ALL
        SELECT run.id, 3, run.workflow, run.flow_key, lim.cap
        FROM run JOIN unnest(p_flow_workflows, p_key_caps) AS lim(name, cap) ON lim.name = run.workflow
        WHERE lim.cap IS NOT NULL AND run.flow_key IS NOT NULL
    ),
    given AS (
        SELECT sc.id, sc.kind, (
            SELECT s FROM generate_series(0, sc.cap - 1) AS s
            WHERE CASE sc.kind
                WHEN 1 THEN NOT EXISTS (SELECT 1 FROM durable_run AS h WHERE h.queue = sc.scope
                    AND h.queue_slot = s AND h.queue_slot IS NOT NULL
                    AND h.status IN ('running', 'compensating') AND h.lease_expires_at IS NOT NULL)
                WHEN 2 THEN NOT EXISTS (SELECT 1 FROM durable_run AS h WHERE h.workflow = sc.scope
                    AND h.workflow_slot = s AND h.workflow_slot IS NOT NULL
                    AND h.status IN ('running', 'compensating') AND h.lease_expires_at IS NOT NULL)
                ELSE NOT EXISTS (SELECT 1 FROM durable_run AS h WHERE h.workflow = sc.scope
                    AND h.flow_key = sc.flow_key AND h.flow_slot = s AND h.flow_slot IS NOT NULL
                    AND h.status IN ('running', 'compensating') AND h.lease_expires_at IS NOT NULL)
                END
            ORDER BY s
            OFFSET sc.n - 1
            LIMIT 1) AS slot
        FROM (SELECT scoped.*, row_number() OVER (PARTITION BY scoped.kind, scoped.scope,
                     scoped.flow_key ORDER BY scoped.id) AS n FROM scoped) AS sc
    ),
    slots AS (
        SELECT run.id, max(g.slot) FILTER (WHERE g.kind = 1) AS q, max(g.slot) FILTER (WHERE g.kind = 2) AS w,
               max(g.slot) FILTER (WHERE g.kind = 3) AS k
        FROM run LEFT JOIN given AS g USING (id) GROUP BY run.id
    )
    UPDATE durable_run AS d SET
        status = CASE WHEN d.status = 'compensating' THEN 'compensating' ELSE 'running' END,
        due_at = CASE WHEN d.status = 'compensating' THEN NULL ELSE d.due_at END,
        worker_id = p_worker,
        lease_expires_at = v_now + p_lease,
        fence = d.fence + 1,
        started_at = COALESCE(d.started_at, v_now),
        queue_slot = slots.q, workflow_slot = slots.w, flow_slot = slots.k
    FROM slots WHERE d.id = slots.id
    RETURNING d.id, d.workflow, d.queue, d.status, d.priority, d.input, d.context, d.result,
        d.error, d."key", d.holds_key, d.runs_after_id, d.parent_id, d.step_index, d.attempt,
        d.due_at, d.timeout_at, d.debounce_deadline, d.waiting_for, d.state, d.worker_id,
        d.lease_expires_at, d.fence, d.recoveries, d.step_names, d.trace_context, d.created_at,
        d.started_at, d.finished_at, d.rerun_of_id, d.rerun_from_step, d.inputs, d.flow_key,
        d.flow_slot, d.workflow_slot, d.queue_slot;
END
$claim$;
