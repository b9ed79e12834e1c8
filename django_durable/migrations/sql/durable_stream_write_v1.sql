-- durable_stream_write_v1: one item of a stream written, one call atomic on its own.
-- Created by 0009_0_4_expand_streams; never edited once released: a change is a
-- durable_stream_write_v2 beside it, in a new migration.
--
-- A function so that a session plans its statements once: a step writing tokens calls
-- it thousands of times, and planning the same write as one statement with CTEs cost
-- as much again as the write itself. It raises the stream's row (made at the first
-- write; its count is the next offset), only while the run is running under the
-- writer's claim (p_fence), the stream is open and not full, and no newer claim wrote
-- to it; then inserts the item, preceded by a 'reset' item when the last write was the
-- same step under an earlier claim (a new execution of the step starts over). Returns
-- the stream's item count and whether a reset went first, or NULLs when nothing was
-- written (the caller asks why). No NOTIFY here: a transaction that NOTIFYs holds a
-- lock of the whole database from its commit until its WAL is flushed, so concurrent
-- writers would commit one by one; the caller NOTIFYs the readers once this committed.
CREATE OR REPLACE FUNCTION durable_stream_write_v1(
    p_run uuid, p_name varchar, p_value jsonb, p_keep_latest boolean, p_step varchar,
    p_step_index integer, p_attempt integer, p_fence integer, p_max_items integer,
    p_now timestamptz,
    OUT written_items integer, OUT with_reset boolean
) RETURNS record
LANGUAGE plpgsql
AS $write$
BEGIN
    INSERT INTO durable_stream AS s (
        run_id, name, items, step_index, fence, reset, latest, closed_at, updated_at)
    SELECT r.id, p_name, 1, p_step_index, p_fence, false,
           CASE WHEN p_keep_latest THEN p_value END, NULL, p_now
    FROM durable_run r
    WHERE r.id = p_run AND r.fence = p_fence AND r.status IN ('running', 'compensating')
    ON CONFLICT (run_id, name) DO UPDATE SET
        items = s.items + 1
            + (s.step_index = EXCLUDED.step_index AND s.fence < EXCLUDED.fence)::integer,
        reset = s.step_index = EXCLUDED.step_index AND s.fence < EXCLUDED.fence,
        step_index = EXCLUDED.step_index, fence = EXCLUDED.fence,
        latest = CASE WHEN p_keep_latest THEN EXCLUDED.latest ELSE s.latest END,
        updated_at = EXCLUDED.updated_at
    WHERE s.closed_at IS NULL AND s.fence <= EXCLUDED.fence
      AND s.items + 1 + (s.step_index = EXCLUDED.step_index
                         AND s.fence < EXCLUDED.fence)::integer <= p_max_items
    RETURNING s.items, s.reset INTO written_items, with_reset;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF with_reset THEN
        INSERT INTO durable_stream_item (
            run_id, stream, "offset", kind, value, step, attempt, written_at)
        VALUES (p_run, p_name, written_items - 2, 'reset', NULL, p_step, p_attempt, p_now);
    END IF;
    INSERT INTO durable_stream_item (
        run_id, stream, "offset", kind, value, step, attempt, written_at)
    VALUES (p_run, p_name, written_items - 1, 'value', p_value, p_step, p_attempt, p_now);
END
$write$;
