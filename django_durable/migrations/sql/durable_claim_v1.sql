-- durable_claim_v1: a worker's claim of up to p_limit due runs, in one statement.
-- Created by migration 0001; never edited: a change is a durable_claim_v2 beside it,
-- in a new migration (docs/production.md, "Upgrading").
--
-- The queues served: those named by p_queues, or when that is NULL every queue with
-- a claimable run, found by skipping through the claim index durable_run_claim
-- (queue, priority DESC, due_at) one queue at a time (a loose index scan: one probe
-- per queue, however many runs wait). The conditions repeat the index's own, so the
-- planner can use it. open_queues keeps those not paused (a probe of durable_queue's
-- primary key per queue) with the room each has: p_limit, or for a limited queue
-- (named in p_limited with its limit in p_caps) the limit less its runs a worker
-- holds, counted through durable_run_lease. The claimers of a limited queue take an
-- advisory lock per queue before the call (store/claims.py, LOCK_LIMITED_QUEUES).
--
-- picked takes, per open queue, up to its room of due runs through the index,
-- highest priority first, then oldest due, and locks them with FOR UPDATE SKIP
-- LOCKED, so concurrent workers claim different runs without waiting on each other;
-- MATERIALIZED keeps the planner from folding it into the UPDATE (which would lock
-- rows the LIMIT then drops); the UPDATE takes the picked rows by primary key. Due
-- and lease times are the database's clock (statement_timestamp()). A worker claims
-- only runs of the workflows it knows (p_workflows, NULL: any, or names starting
-- with one of p_prefixes, LIKE patterns). A claimed compensating run stays
-- compensating and stops being due while owned; the fence grows, so the previous
-- owner's late writes no longer match.
--
-- A function keeps the plan of its statement for the database session (planning it
-- costs several times what running it does); its generic plan is the one the claim
-- index was built for, and "jit = off": not knowing p_limit, the plan's cost is above
-- jit_above_cost, and JIT would compile it at every call.
CREATE OR REPLACE FUNCTION durable_claim_v1(
    p_queues text[], p_limit integer, p_limited text[], p_caps integer[],
    p_workflows text[], p_prefixes text[], p_worker varchar, p_lease interval
) RETURNS SETOF durable_run
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $claim$
BEGIN
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
END
$claim$;
