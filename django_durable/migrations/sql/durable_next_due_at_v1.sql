-- durable_next_due_at_v1: when the next claimable run of the open queues is due,
-- for an idle worker's wait. Created by 0.3.0's migration (0001_0_3_initial); never
-- edited from the tag on: a change is a durable_next_due_at_v2 beside it, in an
-- expand migration of a later release (docs/contributing.md).
--
-- The open queues as the claim finds them (served, open_queues); a queue with
-- no room (its limit reached) is left out: its runs wait for a slot, not a time. Per
-- queue, durable_run_claim is read priority by priority (a loose index scan over the
-- few priorities in use, levels), the first entry of each. Planned once per session,
-- never compiled by JIT, like the claim.
CREATE OR REPLACE FUNCTION durable_next_due_at_v1(
    p_queues text[], p_limit integer, p_limited text[], p_caps integer[]
) RETURNS timestamptz
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $next_due$
BEGIN
    RETURN (
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
)
SELECT min(first.due_at)
FROM open_queues
CROSS JOIN LATERAL (
    WITH RECURSIVE levels(priority) AS (
        (SELECT priority FROM durable_run
         WHERE queue = open_queues.name
           AND status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
         ORDER BY priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT priority FROM durable_run
                WHERE queue = open_queues.name
                  AND status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
                  AND priority < levels.priority
                ORDER BY priority DESC LIMIT 1)
        FROM levels
        WHERE levels.priority IS NOT NULL
    )
    SELECT (SELECT due_at FROM durable_run
            WHERE queue = open_queues.name AND priority = levels.priority
              AND status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
            ORDER BY due_at LIMIT 1) AS due_at
    FROM levels
    WHERE levels.priority IS NOT NULL
) AS first
WHERE open_queues.room > 0
    );
END
$next_due$;
