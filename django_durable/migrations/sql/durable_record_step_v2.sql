-- durable_record_step_v2: a step's record, one call atomic on its own. Created by
-- 0.3.0's migration (0001_0_3_initial); never edited from the tag on. p_replaced:
-- what the step replaced in the context ({name: [old value]}, or {name: []} for a
-- name it added; NULL when it changed nothing), written once into the attempt's row,
-- where a rerun from a step reads it back (operations/rerun.py), never into the
-- run's state, which every later step would write again.
--
-- The fenced UPDATE of the run (by primary key: it must still be running under the
-- claim's fence), one of four by p_change:
--   'next'   a step completed and the run goes on to the next one;
--   'last'   the last step completed: the run is completed, its result the output;
--   'retry'  a step failed with attempts left: pending again, due at p_due_at;
--   'failed' a step failed for good, and so does the run;
-- then, only when the UPDATE changed the run, the attempt's row. Returns one bigint
-- (never a table's row type, so a column added to a table later changes nothing for
-- a caller): the attempt's id, or NULL when the run is not this worker's any more
-- (nothing written).
CREATE OR REPLACE FUNCTION durable_record_step_v2(
    p_change text, p_run uuid, p_fence integer, p_step_index integer, p_context jsonb,
    p_state jsonb, p_due_at timestamptz, p_step varchar, p_attempt integer,
    p_outcome varchar, p_output jsonb, p_error jsonb, p_logs jsonb, p_worker varchar,
    p_started_at timestamptz, p_finished_at timestamptz, p_replaced jsonb
) RETURNS bigint
LANGUAGE plpgsql
AS $record$
DECLARE
    owned uuid;
    recorded bigint;
BEGIN
    IF p_change = 'next' THEN
        UPDATE durable_run
        SET step_index = p_step_index + 1, attempt = 1, context = p_context,
            waiting_for = NULL, state = p_state
        WHERE id = p_run AND fence = p_fence AND status = 'running'
        RETURNING id INTO owned;
    ELSIF p_change = 'last' THEN
        UPDATE durable_run
        SET step_index = p_step_index + 1, attempt = 1, context = p_context,
            waiting_for = NULL, state = p_state, status = 'completed', result = p_output,
            finished_at = p_finished_at, due_at = NULL, lease_expires_at = NULL
        WHERE id = p_run AND fence = p_fence AND status = 'running'
        RETURNING id INTO owned;
    ELSIF p_change = 'retry' THEN
        UPDATE durable_run
        SET status = 'pending', attempt = p_attempt + 1, due_at = p_due_at,
            worker_id = NULL, lease_expires_at = NULL, state = p_state
        WHERE id = p_run AND fence = p_fence AND status = 'running'
        RETURNING id INTO owned;
    ELSIF p_change = 'failed' THEN
        UPDATE durable_run
        SET status = 'failed', error = p_error, finished_at = p_finished_at,
            due_at = NULL, lease_expires_at = NULL, state = p_state
        WHERE id = p_run AND fence = p_fence AND status = 'running'
        RETURNING id INTO owned;
    ELSE
        RAISE EXCEPTION 'durable_record_step_v2: unknown change %', p_change;
    END IF;
    IF owned IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO durable_step_attempt (
        run_id, kind, step, step_index, attempt, status, output, error, logs, worker_id,
        started_at, finished_at, replaced
    ) VALUES (
        owned, 'step', p_step, p_step_index, p_attempt, p_outcome, p_output, p_error,
        p_logs, p_worker, p_started_at, p_finished_at, p_replaced
    )
    RETURNING id INTO recorded;
    RETURN recorded;
END
$record$;
