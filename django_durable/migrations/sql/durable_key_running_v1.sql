-- durable_key_running_v1: how many runs of one flow key a worker holds (status running
-- or compensating, with a lease), counting at most p_cap. Created by migration 0005;
-- never edited: a change is a _v2 beside it, in a new migration.
--
-- durable_claim_v4 calls it from inside its claim statement, once it holds the key's
-- lock. VOLATILE on purpose: a volatile function takes a new snapshot for each query
-- it runs, even when another statement calls it (PostgreSQL, "Function Volatility
-- Categories"), so the count sees every claim of the key committed before the lock
-- was granted, which the calling statement's own snapshot, taken before the lock, may
-- not. PL/pgSQL, not SQL: its query's plan is kept for the database session (an SQL
-- function's is made again for every statement that calls it). No SET clause: it would
-- cost every call. Reads durable_run_flow_busy (one index range per key).
CREATE OR REPLACE FUNCTION durable_key_running_v1(
    p_workflow text, p_flow_key text, p_cap integer
) RETURNS bigint
LANGUAGE plpgsql
VOLATILE
AS $running$
BEGIN
    RETURN (SELECT count(*) FROM (
        SELECT 1 FROM durable_run
        WHERE workflow = p_workflow AND flow_key = p_flow_key
          AND status IN ('running', 'compensating') AND lease_expires_at IS NOT NULL
        LIMIT p_cap) AS held);
END
$running$;
