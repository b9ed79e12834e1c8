-- durable_start_v2: a start on PostgreSQL, in one round trip whether the key is
-- free or taken. A function, so its statements are planned once per database
-- session, not at every start. Created by 0.3.0's migration (0001_0_3_initial);
-- never edited from the tag on: a change is a durable_start_v3 beside it, in an
-- expand migration of a later release (docs/contributing.md). p_flow_key is the
-- run's flow key (Run.flow_key, computed at the start; NULL: none).
--
-- Arguments: the columns a start gives a new run (p_id .. p_created_at; every
-- other column is written as a new run's default), then p_wake and p_channel
-- (NOTIFY an idle worker when the run is due now), p_outcome (the duplicate's
-- outcome for its activity row) and p_answers: the holder states in which a start
-- only answers with the holder, as 'status:picked_up' ('completed:true'), computed
-- by operations/keys.py (holder_answers) from the key rules; empty when the caller
-- records the duplicate itself.
--
-- A run that would hold a key first looks for the key's holder (a read through the
-- unique index durable_run_one_holder_per_key): a duplicate is answered without an
-- INSERT, which would open every index of durable_run even when it inserts nothing.
-- Only a duplicate the start just answers writes its activity row.
-- Then it inserts the run unless that breaks the key's rule (ON CONFLICT DO
-- NOTHING, naming the conflict so that only that index is probed: a taken key is an
-- answer, never an error that would abort the caller's transaction). A run that went
-- in and is due now wakes an idle worker with a NOTIFY, delivered at commit.
-- Otherwise, for a keyed run, it looks for the holder again, in a statement of its
-- own, so in READ COMMITTED it sees a holder that committed while the insert waited.
--
-- Returns one JSON value: true for a run that went in; the holder's id when the
-- duplicate was noted; the holder's columns when the caller decides; NULL when
-- nothing went in and no run holds the key any more.
CREATE OR REPLACE FUNCTION durable_start_v2(
    p_id uuid, p_workflow varchar, p_queue varchar, p_priority integer, p_input jsonb,
    p_context jsonb, p_key varchar, p_holds_key boolean, p_runs_after_id uuid, p_parent_id uuid,
    p_due_at timestamptz, p_timeout_at timestamptz, p_debounce_deadline timestamptz,
    p_step_names jsonb, p_trace_context jsonb, p_created_at timestamptz, p_flow_key varchar,
    p_wake boolean, p_channel text, p_outcome text, p_answers text[]
) RETURNS jsonb
LANGUAGE plpgsql
AS $start$
DECLARE
    holder record;
    tries integer := 0;
BEGIN
    LOOP
        IF p_holds_key OR tries > 0 THEN
            -- The key's holder, through durable_run_one_holder_per_key.
            SELECT h.id, h.workflow, h.queue, h.status, h.input, h."key", h.holds_key,
                   h.due_at, h.debounce_deadline, h.started_at
            FROM durable_run AS h
            WHERE h.workflow = p_workflow AND h."key" = p_key AND h.holds_key
            INTO holder;
            IF FOUND THEN
                IF holder.status || ':' || (holder.started_at IS NOT NULL)::text
                   = ANY (p_answers) THEN
                    INSERT INTO durable_activity (kind, run_id, workflow, "key", details, created_at)
                    VALUES (
                        'key_duplicate', holder.id, holder.workflow, holder."key",
                        jsonb_build_object(
                            'key', holder."key", 'workflow', holder.workflow,
                            'outcome', p_outcome,
                            'input_changed', holder.input IS DISTINCT FROM p_input,
                            'input', p_input),
                        p_created_at
                    );
                    RETURN jsonb_build_object(
                        'id', holder.id, 'noted', true,
                        'input_changed', holder.input IS DISTINCT FROM p_input);
                END IF;
                RETURN jsonb_build_object(
                    'id', holder.id, 'workflow', holder.workflow, 'queue', holder.queue,
                    'status', holder.status, 'input', holder.input, 'key', holder."key",
                    'holds_key', holder.holds_key, 'due_at', holder.due_at,
                    'debounce_deadline', holder.debounce_deadline,
                    'started_at', holder.started_at,
                    'noted', false, 'input_changed', holder.input IS DISTINCT FROM p_input);
            END IF;
            IF tries > 0 THEN
                RETURN NULL;  -- nothing went in, and no run holds the key any more
            END IF;
        END IF;
        -- A new run: the start's columns and a new run's defaults.
        INSERT INTO durable_run (
            id, workflow, queue, status, priority, input, context, result, error, "key",
            holds_key, runs_after_id, parent_id, step_index, attempt, due_at, timeout_at,
            debounce_deadline, waiting_for, state, worker_id, lease_expires_at, fence,
            recoveries, step_names, trace_context, created_at, started_at, finished_at,
            flow_key
        ) VALUES (
            p_id, p_workflow, p_queue, 'pending', p_priority, p_input, p_context, NULL, NULL,
            p_key, p_holds_key, p_runs_after_id, p_parent_id, 0, 1, p_due_at, p_timeout_at,
            p_debounce_deadline, NULL, '{}', NULL, NULL, 0,
            0, p_step_names, p_trace_context, p_created_at, NULL, NULL,
            p_flow_key
        )
        ON CONFLICT (workflow, "key") WHERE holds_key DO NOTHING;
        IF FOUND THEN
            IF p_wake THEN
                PERFORM pg_notify(p_channel, p_queue);
            END IF;
            RETURN 'true'::jsonb;
        END IF;
        IF p_key IS NULL THEN
            RETURN NULL;
        END IF;
        tries := tries + 1;  -- look for the holder that took the key meanwhile
    END LOOP;
END
$start$;
