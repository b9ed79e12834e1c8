"""The existing runs of the scale suite, made by PostgreSQL itself (one
``INSERT … SELECT generate_series`` per size step, no rows through Python).

Runs come in groups of three consecutive runs sharing a workflow and a key (a key
re-used over time); the newest of a group holds the key. 95% of the runs are
finished (completed, a few failed or cancelled); 5% are active or waiting: delayed
pending runs (due tomorrow), runs waiting for an event (not due) and sleeping runs
(due tomorrow). Nothing of the filler is due, so a worker claims only what the
benchmark starts. Four workflows of five have keys; the traffic's own workflow
(``bench_keyed``) has 40% of the rows, so its key index is as big as the table
says. Creation times spread back over about a month. A re-add (``key_duplicate``
activity) is added for one run in twenty, over the last week.
"""

from __future__ import annotations

# {first} .. {last}: the row numbers of this step; {total}: the biggest size, so the
# creation times of a row do not depend on the step that made it.
RUNS_SQL = """
INSERT INTO durable_run (id, workflow, queue, status, input, context, state, result, key,
                         holds_key, step_index, attempt, fence, due_at, waiting_for,
                         created_at, started_at, finished_at)
SELECT gen_random_uuid(), w.workflow, 'default', s.status,
       jsonb_build_object('id', g, 'revision', i % 3), '{{}}'::jsonb, '{{}}'::jsonb,
       CASE WHEN s.status = 'completed' THEN 'null'::jsonb END,
       k.key,
       k.key IS NOT NULL AND i % 3 = 2,
       CASE WHEN s.status = 'completed' THEN 1 ELSE 0 END, 1, 1,
       CASE WHEN s.status IN ('pending', 'waiting') AND s.waits IS DISTINCT FROM 'event:paid'
            THEN now() + interval '1 day' END,
       s.waits,
       c.at, c.at,
       CASE WHEN s.status IN ('completed', 'failed', 'cancelled') THEN c.at + interval '1 second'
       END
FROM generate_series({first}::bigint, {last}::bigint) AS i
CROSS JOIN LATERAL (SELECT i / 3 AS g) AS grp
CROSS JOIN LATERAL (SELECT CASE WHEN g % 10 < 4 THEN 'bench_keyed'
                                WHEN g % 10 < 7 THEN 'scale_orders'
                                WHEN g % 10 < 9 THEN 'scale_emails'
                                ELSE 'scale_reports' END AS workflow) AS w
CROSS JOIN LATERAL (SELECT CASE WHEN g % 10 = 9 THEN NULL ELSE 'item:' || g END AS key) AS k
CROSS JOIN LATERAL (SELECT now() - make_interval(secs => ({total} - i) * 0.5) AS at) AS c
-- the newest run of one group in seven (1 in 21 runs, about 5%) is still going
CROSS JOIN LATERAL (
    SELECT CASE WHEN i % 3 = 2 AND g % 7 = 0 THEN
                     (ARRAY['pending', 'waiting', 'waiting'])[1 + g % 3]
                WHEN (i * 31) % 100 < 2 THEN 'failed'
                WHEN (i * 31) % 100 = 2 THEN 'cancelled'
                ELSE 'completed' END AS status,
           CASE WHEN i % 3 = 2 AND g % 7 = 0 THEN
                     (ARRAY[NULL, 'event:paid', 'sleep'])[1 + g % 3]
           END AS waits
) AS s
"""

ACTIVITY_SQL = """
INSERT INTO durable_activity (kind, run_id, workflow, key, details, created_at)
SELECT 'key_duplicate', NULL, w.workflow, 'item:' || g,
       jsonb_build_object('workflow', w.workflow, 'key', 'item:' || g,
                          'outcome', 'use_existing', 'input_changed', g % 3 = 0),
       now() - make_interval(secs => (j % 604800))
FROM generate_series({first}, {last}, 20) AS j
CROSS JOIN LATERAL (SELECT j / 3 AS g) AS grp
CROSS JOIN LATERAL (SELECT CASE WHEN g % 10 < 4 THEN 'bench_keyed'
                                WHEN g % 10 < 7 THEN 'scale_orders'
                                ELSE 'scale_emails' END AS workflow) AS w
WHERE g % 10 <> 9
"""


def fill(cursor, first: int, last: int, total: int) -> None:
    """Add the existing runs numbered ``first`` to ``last`` (inclusive)."""
    if last < first:
        return
    cursor.execute(RUNS_SQL.format(first=first, last=last, total=total))
    cursor.execute(ACTIVITY_SQL.format(first=first, last=last))
