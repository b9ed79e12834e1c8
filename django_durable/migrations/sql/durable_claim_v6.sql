-- durable_claim_v6: a worker's claim of up to p_limit due runs, with every limit (docs/flow-control.md;
-- docs/architecture.md, "Flow limits"). Created by 0.4's migration 0010_0_4_expand_claim_v6.
-- A claimed run of a limited scope takes a free slot below its limit, which a partial unique index
-- keeps to one run holding a worker; a begin under rate_per_key takes a rate slot free for `per`.
-- The locks make a refusal rare: a queue's and a workflow's are waited for (in name order), their
-- room counted after them (READ COMMITTED, which the store sets); a key's are tried, its slots'
-- too (a key's slots are shared), and the last statement drops a slot committed since read free.
-- 1. The open queues, their room. 2. The gate on runs due: none with a flow key or of a capped
-- workflow -> 3. the fast path. 4. Else one statement: per queue its (flow key, workflow) pairs in
-- turns from its pointer, up to its room; their runs in claim order (priority, round, turn); the
-- pointers moved. 5. The rate slots, each run's slots, one UPDATE. Plans kept per session.
CREATE OR REPLACE FUNCTION durable_claim_v6(
    p_queues text[], p_limit integer, p_limited text[], p_caps integer[],
    p_workflows text[], p_prefixes text[], p_worker varchar, p_lease interval,
    p_flow_workflows text[], p_key_caps integer[], p_flow_caps integer[],
    p_rates integer[], p_pers interval[]
) RETURNS TABLE (  -- explicit columns: a column added to durable_run never changes them
    id uuid, workflow varchar, queue varchar, status varchar, priority integer, input jsonb, context jsonb,
    result jsonb, error jsonb, "key" varchar, holds_key boolean, runs_after_id uuid, parent_id uuid,
    step_index integer, attempt integer, due_at timestamptz, timeout_at timestamptz,
    debounce_deadline timestamptz, waiting_for varchar, state jsonb, worker_id varchar,
    lease_expires_at timestamptz, fence integer, recoveries integer, step_names jsonb, trace_context jsonb,
    created_at timestamptz, started_at timestamptz, finished_at timestamptz, rerun_of_id uuid,
    rerun_from_step varchar, inputs jsonb, flow_key varchar, flow_slot smallint, workflow_slot smallint,
    queue_slot smallint
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_incremental_sort = off
AS $claim$
#variable_conflict use_column
DECLARE
    v_now timestamptz := statement_timestamp();
    v_open text[];  v_room integer[];  -- the open queues served, in name order; their room
    v_capped text[];  -- the workflows with a workflow-wide limit and a due run
    v_keyed boolean;  -- a flow-keyed run due in a queue with room
    -- The runs to claim: their ids, queues, workflows, flow keys, key slots, rate slots.
    v_ids uuid[];  v_queues text[];  v_workflows text[];  v_keys text[];  v_key_slots integer[];
    v_rate_slots integer[];
BEGIN
    -- 1. The queues named, or those with a claimable run (a loose scan of durable_run_claim).
    SELECT array_agg(s.name ORDER BY s.name) INTO v_open FROM (
        WITH RECURSIVE found(name) AS (
            SELECT ''::text
            UNION ALL
            SELECT (SELECT min(r.queue) FROM durable_run AS r
                    WHERE durable_claimable_v1(r.status, r.due_at) AND r.queue > found.name)
            FROM found WHERE found.name IS NOT NULL AND p_queues IS NULL
        )
        SELECT found.name FROM found WHERE found.name > '' UNION SELECT unnest(p_queues)
    ) AS s WHERE NOT COALESCE((SELECT q.paused FROM durable_queue AS q WHERE q.name = s.name), false);
    IF v_open IS NULL THEN RETURN; END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('django_durable.queue:' || o, 0))  -- in name order
    FROM (SELECT o FROM unnest(v_open) AS o WHERE o = ANY (p_limited) ORDER BY o) AS o;
    -- After the locks, a new statement (a snapshot with the claims committed before them): each
    -- queue's room, never below 0; 2. the gate, on runs due.
    WITH o AS (SELECT o.name, CASE WHEN l.cap IS NULL THEN p_limit ELSE GREATEST(l.cap - (
                   SELECT count(*) FROM durable_run AS h WHERE h.queue = o.name
                      AND durable_holds_worker_v1(h.status, h.lease_expires_at)), 0) END AS room
               FROM unnest(v_open) AS o(name) LEFT JOIN unnest(p_limited, p_caps) AS l(name, cap) USING (name))
    SELECT (SELECT array_agg(o.room ORDER BY o.name) FROM o),
           ARRAY(SELECT f.name FROM unnest(p_flow_workflows, p_flow_caps) AS f(name, cap)
                 WHERE f.cap IS NOT NULL AND EXISTS (
                     SELECT 1 FROM durable_run AS r WHERE r.workflow = f.name AND r.queue = ANY (v_open)
                        AND durable_claimable_v1(r.status, r.due_at) AND r.due_at <= v_now) ORDER BY f.name),
           EXISTS (SELECT 1 FROM o WHERE o.room > 0 AND EXISTS (
               SELECT 1 FROM durable_run AS r WHERE r.queue = o.name AND r.flow_key IS NOT NULL
                  AND durable_claimable_v1(r.status, r.due_at) AND r.due_at <= v_now))
    INTO v_room, v_capped, v_keyed;
    IF cardinality(v_capped) = 0 AND NOT v_keyed THEN  -- 3. Fast path.
        SELECT array_agg(p.id), array_agg(p.queue), array_agg(p.workflow) INTO v_ids, v_queues, v_workflows
        FROM (SELECT p.* FROM unnest(v_open, v_room) AS o(name, room) CROSS JOIN LATERAL (
                SELECT r.id, r.queue, r.workflow, r.priority, r.due_at FROM durable_run AS r
                WHERE r.queue = o.name AND durable_claimable_v1(r.status, r.due_at) AND r.due_at <= v_now
                  AND (p_workflows IS NULL OR r.workflow = ANY (p_workflows) OR r.workflow LIKE ANY (p_prefixes))
                ORDER BY r.priority DESC, r.due_at LIMIT LEAST(o.room, p_limit)
                FOR UPDATE SKIP LOCKED) AS p
              ORDER BY p.priority DESC, p.due_at LIMIT p_limit) AS p;
    ELSE  -- 4. Flow path.
        PERFORM pg_advisory_xact_lock(hashtextextended('django_durable.workflow:' || w, 0))
        FROM unnest(v_capped) AS w;  -- v_capped is in name order
        WITH pair AS MATERIALIZED (  -- per queue with room: its (flow key, workflow) pairs taken, in
            -- turns from its pointer (the key the queue's last claim took last): the keys after it, then
            -- from the first key (wrapped), up to it again
            SELECT o.name AS queue, x.flow_key, x.workflow, x.place,
                   NULLIF(x.slots, '{}') AS slots  -- NULL: no key limit
            FROM unnest(v_open, v_room) AS o(name, room) CROSS JOIN LATERAL (
                WITH RECURSIVE walk(flow_key, workflow, wrapped, n, pointer) AS (
                    SELECT t.flow_key, NULL::varchar, false, 0, t.flow_key  -- the pointer, read once
                    FROM (SELECT) AS one LEFT JOIN LATERAL (SELECT t.flow_key::varchar FROM durable_flow_turn AS t
                          WHERE t.queue = o.name ORDER BY t.claimed_at DESC LIMIT 1) AS t ON true
                    UNION ALL
                    SELECT nxt.*, walk.n + 1, walk.pointer FROM walk CROSS JOIN LATERAL (
                        (SELECT r.flow_key::varchar, r.workflow::varchar, walk.wrapped FROM durable_run AS r
                         WHERE walk.n > 0 AND r.queue = o.name
                           AND (r.flow_key, r.workflow) > (walk.flow_key, walk.workflow)
                           AND durable_claimable_v1(r.status, r.due_at) AND r.flow_key IS NOT NULL
                         ORDER BY r.flow_key, r.workflow LIMIT 1)
                        UNION ALL  -- from the pointer: by key alone (a row compared with NULL reads the key whole)
                        (SELECT r.flow_key::varchar, r.workflow::varchar, false FROM durable_run AS r
                         WHERE walk.n = 0 AND r.queue = o.name AND r.flow_key > walk.flow_key
                           AND durable_claimable_v1(r.status, r.due_at) AND r.flow_key IS NOT NULL
                         ORDER BY r.flow_key, r.workflow LIMIT 1)
                        UNION ALL
                        (SELECT r.flow_key::varchar, r.workflow::varchar, true FROM durable_run AS r
                         WHERE NOT walk.wrapped AND r.queue = o.name
                           AND durable_claimable_v1(r.status, r.due_at) AND r.flow_key IS NOT NULL
                         ORDER BY r.flow_key, r.workflow LIMIT 1)
                        LIMIT 1) AS nxt
                    WHERE walk.pointer IS NULL OR NOT (nxt.wrapped AND nxt.flow_key > walk.pointer)
                ),
                taken AS (  -- a pair with a due run no other claim holds, its key's lock, its slots if limited
                    SELECT walk.*, t.slots FROM walk
                    LEFT JOIN unnest(p_flow_workflows, p_key_caps, p_rates) AS l(workflow, key_cap, rate)
                         USING (workflow)
                    CROSS JOIN LATERAL (SELECT length(walk.workflow) || ':' || walk.workflow || ':' || walk.flow_key)
                         AS k(scope)
                    CROSS JOIN LATERAL (SELECT CASE  -- in this order, the locks last; NULL: not taken
                        WHEN NOT (p_workflows IS NULL OR walk.workflow = ANY (p_workflows)
                                  OR walk.workflow LIKE ANY (p_prefixes)) THEN NULL
                        WHEN (SELECT r.id FROM durable_run AS r WHERE r.queue = o.name AND r.flow_key = walk.flow_key
                                AND r.workflow = walk.workflow AND durable_claimable_v1(r.status, r.due_at)
                                AND r.due_at <= v_now ORDER BY r.priority DESC, r.due_at, r.id
                              LIMIT 1 FOR UPDATE SKIP LOCKED) IS NULL THEN NULL
                        WHEN l.rate IS NOT NULL AND NOT pg_try_advisory_xact_lock(  -- one claimer: its rate slots
                             hashtextextended('django_durable.flow_key:' || k.scope, 0)) THEN NULL
                        WHEN l.key_cap IS NULL THEN '{}'::integer[]
                        WHEN l.rate IS NULL AND NOT pg_try_advisory_xact_lock_shared(  -- v5 takes it exclusive
                             hashtextextended('django_durable.flow_key:' || k.scope, 0)) THEN NULL
                        ELSE (SELECT ARRAY(  -- of the lowest free slots within the room, those whose lock it gets
                            SELECT f.s FROM (SELECT g.s FROM (SELECT generate_series(0, l.key_cap - 1) AS s) AS g
                                             WHERE g.s <> ALL (h.held) LIMIT GREATEST(h.room, 0)) AS f
                            WHERE pg_try_advisory_xact_lock(hashtextextended(
                                  'django_durable.flow_slot:' || k.scope || ':' || f.s, 0))
                            LIMIT LEAST(o.room, p_limit))
                        FROM (SELECT COALESCE(array_agg(h.flow_slot) FILTER (WHERE h.flow_slot < l.key_cap), '{}'),
                                     l.key_cap - count(*)  -- the room: the limit less every run holding a worker
                              FROM durable_run AS h WHERE h.workflow = walk.workflow AND h.flow_key = walk.flow_key
                                 AND durable_holds_worker_v1(h.status, h.lease_expires_at)) AS h(held, room))
                        END) AS t(slots)
                    WHERE walk.n > 0 AND (cardinality(t.slots) > 0 OR l.key_cap IS NULL AND t.slots IS NOT NULL)
                    LIMIT LEAST(o.room, p_limit)  -- no ORDER BY: the walk is read only this far
                )
                SELECT taken.flow_key, taken.workflow, taken.n::numeric, taken.slots FROM taken
                UNION ALL  -- the runs without a flow key: in the turn of key '', at the wrap
                SELECT NULL, NULL, COALESCE((SELECT min(n) FROM taken WHERE wrapped),
                                            (SELECT max(n) + 1 FROM taken), 1) - 0.5, NULL
            ) AS x(flow_key, workflow, place, slots) WHERE o.room > 0
        ),
        lim AS (SELECT * FROM unnest(p_flow_workflows, p_key_caps, p_flow_caps, p_rates, p_pers)
                AS l(workflow, key_cap, cap, rate, per)),
        cand AS MATERIALIZED (
            SELECT c.*, pair.place FROM pair CROSS JOIN LATERAL (
                SELECT r.id, r.queue, r.workflow, r.flow_key, r.priority, r.due_at, r.started_at
                FROM durable_run AS r WHERE pair.flow_key IS NOT NULL AND r.queue = pair.queue
                  AND r.flow_key = pair.flow_key AND r.workflow = pair.workflow
                  AND durable_claimable_v1(r.status, r.due_at) AND r.due_at <= v_now
                ORDER BY r.priority DESC, r.due_at, r.id LIMIT p_limit FOR UPDATE SKIP LOCKED) AS c
            UNION ALL
            SELECT c.*, pair.place FROM pair CROSS JOIN LATERAL (
                SELECT r.id, r.queue, r.workflow, r.flow_key, r.priority, r.due_at, r.started_at
                FROM durable_run AS r WHERE pair.flow_key IS NULL AND r.queue = pair.queue AND r.flow_key IS NULL
                  AND durable_claimable_v1(r.status, r.due_at) AND r.due_at <= v_now
                  AND (p_workflows IS NULL OR r.workflow = ANY (p_workflows) OR r.workflow LIKE ANY (p_prefixes))
                ORDER BY r.priority DESC, r.due_at LIMIT p_limit FOR UPDATE SKIP LOCKED) AS c
        ),
        key_room AS (  -- each key's room once: the slots its pairs took (the same first ones), its rate slots
            SELECT DISTINCT ON (k.workflow, k.flow_key) k.workflow, k.flow_key, k.slots,
                   CASE WHEN lim.rate IS NOT NULL THEN ARRAY(
                       SELECT s FROM generate_series(0, lim.rate - 1) AS s WHERE NOT EXISTS (
                           SELECT 1 FROM durable_flow_rate_slot AS b WHERE b.workflow = k.workflow
                              AND b.flow_key = k.flow_key AND b.slot = s AND b.begun_at > v_now - lim.per)
                       ORDER BY s) END AS free_rate
            FROM pair AS k JOIN lim USING (workflow) WHERE k.flow_key IS NOT NULL
            ORDER BY k.workflow, k.flow_key, cardinality(k.slots) DESC
        ),
        ranked AS (
            SELECT cand.*, kr.slots, kr.free_rate, cand.started_at IS NULL AND kr.free_rate IS NOT NULL AS begins,
                   row_number() OVER (PARTITION BY cand.workflow, cand.flow_key
                                      ORDER BY cand.priority DESC, cand.due_at, cand.id) AS key_n,
                   row_number() OVER (PARTITION BY cand.workflow, cand.flow_key, cand.started_at IS NULL
                                      ORDER BY cand.priority DESC, cand.due_at, cand.id) AS begin_n,
                   row_number() OVER (PARTITION BY cand.queue, cand.place
                                      ORDER BY cand.priority DESC, cand.due_at, cand.id) AS round
            FROM cand LEFT JOIN key_room AS kr ON kr.workflow = cand.workflow AND kr.flow_key = cand.flow_key
        ),
        kept AS (
            SELECT ranked.*,
                   row_number() OVER (PARTITION BY ranked.queue ORDER BY ranked.priority DESC,
                                      ranked.round, ranked.place, ranked.due_at) AS queue_n,
                   row_number() OVER (PARTITION BY ranked.workflow ORDER BY ranked.priority DESC,
                                      ranked.round, ranked.place, ranked.due_at) AS workflow_n
            FROM ranked WHERE (ranked.slots IS NULL OR ranked.key_n <= cardinality(ranked.slots))
              AND (NOT ranked.begins OR ranked.begin_n <= cardinality(ranked.free_rate))
        ),
        claimed AS (
            SELECT kept.* FROM kept JOIN unnest(v_open, v_room) AS o(name, room) ON o.name = kept.queue
            LEFT JOIN (SELECT lim.workflow, GREATEST(lim.cap - (SELECT count(*) FROM durable_run AS h
                           WHERE h.workflow = lim.workflow
                             AND durable_holds_worker_v1(h.status, h.lease_expires_at)), 0)
                       FROM lim WHERE lim.workflow = ANY (v_capped)) AS w(workflow, room) USING (workflow)
            WHERE kept.queue_n <= o.room AND (w.room IS NULL OR kept.workflow_n <= w.room)
            ORDER BY kept.priority DESC, kept.round, kept.place, kept.due_at LIMIT p_limit
        ),
        moved AS (  -- the queue's pointer: the key it took last, at its highest level; a row another
            INSERT INTO durable_flow_turn (queue, flow_key, claimed_at)  -- claim is moving now (its lock
            SELECT p.*, v_now FROM (  -- tried) is left to it: claimers of one key never wait for each other
                SELECT DISTINCT ON (claimed.queue) claimed.queue, COALESCE(claimed.flow_key, '') AS flow_key
                FROM claimed ORDER BY claimed.queue, claimed.priority DESC, claimed.round DESC, claimed.place DESC
            ) AS p WHERE pg_try_advisory_xact_lock(hashtextextended(
                'django_durable.turn:' || length(p.queue) || ':' || p.queue || ':' || p.flow_key, 0))
            ON CONFLICT (queue, flow_key) DO UPDATE SET claimed_at = EXCLUDED.claimed_at
        )
        SELECT array_agg(claimed.id), array_agg(claimed.queue), array_agg(claimed.workflow),
               array_agg(claimed.flow_key), array_agg(claimed.slots[claimed.key_n]),
               array_agg(CASE WHEN claimed.begins THEN claimed.free_rate[claimed.begin_n] END)
        INTO v_ids, v_queues, v_workflows, v_keys, v_key_slots, v_rate_slots FROM claimed;
    END IF;
    IF cardinality(v_ids) > 0 THEN  -- 5. The claim.
    RETURN QUERY
    WITH rated AS (  -- the begins' rate slots: one begun in the window meanwhile refuses
        INSERT INTO durable_flow_rate_slot AS b (workflow, flow_key, slot, begun_at)
        SELECT c.workflow, c.flow_key, c.slot, v_now
        FROM unnest(v_workflows, v_keys, v_rate_slots) AS c(workflow, flow_key, slot) WHERE c.slot IS NOT NULL
        ON CONFLICT (workflow, flow_key, slot) DO UPDATE SET begun_at = EXCLUDED.begun_at
        WHERE b.begun_at <= v_now - (SELECT l.per FROM unnest(p_flow_workflows, p_pers) AS l(workflow, per)
                                     WHERE l.workflow = b.workflow)
        RETURNING b.workflow, b.flow_key, b.slot
    ),
    run AS (  -- a key slot committed by another claim since it was read free is not taken
        SELECT c.id, c.queue, c.workflow, c.flow_key, c.key_slot
        FROM unnest(v_ids, v_queues, v_workflows, v_keys, v_key_slots, v_rate_slots)
             AS c(id, queue, workflow, flow_key, key_slot, slot)
        WHERE (c.slot IS NULL OR EXISTS (SELECT 1 FROM rated AS t WHERE t.workflow = c.workflow
                                         AND t.flow_key = c.flow_key AND t.slot = c.slot))
          AND (c.key_slot IS NULL OR NOT EXISTS (
               SELECT 1 FROM durable_run AS h WHERE h.workflow = c.workflow AND h.flow_key = c.flow_key
                  AND h.flow_slot = c.key_slot AND durable_holds_worker_v1(h.status, h.lease_expires_at)))
    ),
    scoped AS (  -- each run's limited queue (1) and workflow (2), its rank in each
        SELECT run.*, s.kind, s.cap, s.scope, row_number() OVER (PARTITION BY s.kind, s.scope ORDER BY run.id) AS n
        FROM run CROSS JOIN LATERAL (
            SELECT 1, l.cap, run.queue FROM unnest(p_limited, p_caps) AS l(name, cap) WHERE l.name = run.queue
            UNION ALL
            SELECT 2, l.cap, run.workflow FROM unnest(p_flow_workflows, p_flow_caps) AS l(name, cap)
            WHERE l.name = run.workflow) AS s(kind, cap, scope)
        WHERE s.cap IS NOT NULL
    ),
    free AS (  -- per scope, its smallest free slots, one per run: the n-th is below held + n
        SELECT g.kind, g.scope, ARRAY(
                   SELECT s FROM generate_series(0, LEAST(g.cap, cardinality(h.held) + g.wanted) - 1) AS s
                   WHERE s <> ALL (h.held) ORDER BY s LIMIT g.wanted) AS slots
        FROM (SELECT kind, scope, min(cap) AS cap, count(*) AS wanted FROM scoped GROUP BY kind, scope) AS g
        CROSS JOIN LATERAL (SELECT ARRAY(  -- the slots held, through the scope's slot index
            SELECT h.queue_slot FROM durable_run AS h WHERE g.kind = 1 AND h.queue = g.scope
               AND h.queue_slot IS NOT NULL AND durable_holds_worker_v1(h.status, h.lease_expires_at)
            UNION ALL
            SELECT h.workflow_slot FROM durable_run AS h WHERE g.kind = 2 AND h.workflow = g.scope
               AND h.workflow_slot IS NOT NULL AND durable_holds_worker_v1(h.status, h.lease_expires_at)
            )) AS h(held)
    ),
    slots AS (
        SELECT run.id, max(free.slots[sc.n]) FILTER (WHERE sc.kind = 1) AS q,
               max(free.slots[sc.n]) FILTER (WHERE sc.kind = 2) AS w, min(run.key_slot) AS k
        FROM run LEFT JOIN scoped AS sc USING (id) LEFT JOIN free USING (kind, scope) GROUP BY run.id
        HAVING count(sc.id) = count(free.slots[sc.n])  -- a run with no free slot in a scope is not claimed
    )
    UPDATE durable_run AS d SET
        status = CASE WHEN d.status = 'compensating' THEN 'compensating' ELSE 'running' END,
        due_at = CASE WHEN d.status = 'compensating' THEN NULL ELSE d.due_at END,
        worker_id = p_worker, lease_expires_at = v_now + p_lease, fence = d.fence + 1,
        started_at = COALESCE(d.started_at, v_now),
        queue_slot = slots.q, workflow_slot = slots.w, flow_slot = slots.k
    FROM slots WHERE d.id = slots.id
    RETURNING d.id, d.workflow, d.queue, d.status, d.priority, d.input, d.context, d.result, d.error, d."key",
        d.holds_key, d.runs_after_id, d.parent_id, d.step_index, d.attempt, d.due_at, d.timeout_at,
        d.debounce_deadline, d.waiting_for, d.state, d.worker_id, d.lease_expires_at, d.fence, d.recoveries,
        d.step_names, d.trace_context, d.created_at, d.started_at, d.finished_at, d.rerun_of_id,
        d.rerun_from_step, d.inputs, d.flow_key, d.flow_slot, d.workflow_slot, d.queue_slot;
    END IF;
END
$claim$;
