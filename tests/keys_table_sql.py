"""A big runs table made by PostgreSQL itself (generate_series), for the query
plan tests and ``bench/keys_table.py``.

Runs come in pairs per (workflow, key); the newer one holds the key except for
one key in seven (released); a fifth of the runs have no key; statuses are
mostly completed. Re-adds are spread over a week and skewed toward a few keys.
"""

from django.db import connection

WORKFLOWS = 5

RUNS_SQL = """
INSERT INTO durable_run (id, workflow, queue, status, input, context, state, key, holds_key,
                         step_index, attempt, fence, created_at, started_at, finished_at)
SELECT gen_random_uuid(),
       'workflow_' || (i % {workflows}),
       'default',
       s.status,
       jsonb_build_object('id', i / 10, 'revision', i),
       '{{}}'::jsonb, '{{}}'::jsonb,
       k.key,
       -- the newer run of a key holds it, unless its key was released
       k.key IS NOT NULL AND i % 10 >= 5 AND (i / 10) % 7 <> 0,
       1, 1, 1,
       now() - make_interval(secs => ({rows} - i) * 0.5),
       now() - make_interval(secs => ({rows} - i) * 0.5),
       CASE WHEN s.status IN ('pending', 'running') THEN NULL
            ELSE now() - make_interval(secs => ({rows} - i) * 0.5) END
FROM generate_series(0, {rows} - 1) AS i
CROSS JOIN LATERAL (SELECT CASE WHEN (i / 10) % 5 = 0 THEN NULL
                                ELSE 'item:' || (i / 10) END AS key) AS k
CROSS JOIN LATERAL (SELECT CASE WHEN i % 50 = 0 THEN 'failed'
                                WHEN i % 97 = 0 THEN 'pending'
                                WHEN i % 89 = 0 THEN 'running'
                                ELSE 'completed' END AS status) AS s
"""

# Re-adds over a week, skewed so that a few keys are re-added often.
ACTIVITY_SQL = """
INSERT INTO durable_activity (kind, run_id, workflow, key, details, created_at)
SELECT 'key_duplicate', NULL, a.workflow, a.key,
       jsonb_build_object('workflow', a.workflow, 'key', a.key,
                          'outcome',
                          (ARRAY['use_existing', 'error', 'run_again', 'debounced'])[1 + j % 4],
                          'input_changed', j % 3 = 0, 'input', jsonb_build_object('id', j)),
       now() - make_interval(secs => random() * 7 * 86400)
FROM generate_series(1, {activity}) AS j
CROSS JOIN LATERAL (
    SELECT 'workflow_' || (n % {workflows}) AS workflow, 'item:' || (n / 10 * 1) AS key
    FROM (SELECT (10 * floor(power(random(), 4) * {rows} / 10))::bigint
                 + (j % {workflows}) AS n) AS pick
) AS a
WHERE (a.key IS NOT NULL)
"""


def fill_keys_table(rows: int, activity: int, *, vacuum: bool = False) -> None:
    """Insert ``rows`` runs and about ``activity`` re-adds (PostgreSQL only)."""
    with connection.cursor() as cursor:
        cursor.execute(RUNS_SQL.format(rows=rows, workflows=WORKFLOWS))
        cursor.execute(ACTIVITY_SQL.format(rows=rows, activity=activity, workflows=WORKFLOWS))
        verb = "VACUUM ANALYZE" if vacuum else "ANALYZE"
        cursor.execute(f"{verb} durable_run")
        cursor.execute(f"{verb} durable_activity")
