"""PostgreSQL's own limit: what a job table costs with psycopg and no library at all.

- ``raw_insert``: single-row INSERTs into a table with a jsonb column and a partial
  unique index (the shape of a keyed start), autocommit.
- ``raw_cycle_c1`` / ``raw_cycle_c4``: per run, claim one row (``FOR UPDATE SKIP
  LOCKED``), two step updates, complete; 1 and 4 connections (threads).
"""

from __future__ import annotations

import threading

from bench.common import Results, connect, rate, recreate_database, stopwatch, suite_args, wanted

SCHEMA = """
CREATE TABLE raw_run (
    id bigserial PRIMARY KEY,
    key text,
    holds_key boolean NOT NULL DEFAULT false,
    status text NOT NULL DEFAULT 'pending',
    input jsonb NOT NULL DEFAULT '{}',
    context jsonb NOT NULL DEFAULT '{}',
    step_index int NOT NULL DEFAULT 0,
    due_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz
);
CREATE UNIQUE INDEX raw_run_one_holder ON raw_run (key) WHERE holds_key;
CREATE INDEX raw_run_claim ON raw_run (due_at) WHERE status = 'pending';
"""

CLAIM = """
UPDATE raw_run SET status = 'running', started_at = now()
WHERE id = (SELECT id FROM raw_run WHERE status = 'pending' AND due_at <= now()
            ORDER BY due_at LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id
"""


def raw_insert(db: str, n: int, tag: str) -> float:
    with connect(db) as conn, stopwatch() as elapsed:
        for i in range(n):
            conn.execute(
                "INSERT INTO raw_run (key, holds_key, input, due_at) VALUES (%s, true, %s, now())",
                (f"{tag}:{i}", f'{{"i": {i}}}'),
            )
    return rate(n, elapsed())


def _cycle(db: str) -> None:
    with connect(db) as conn:
        while True:
            row = conn.execute(CLAIM).fetchone()
            if row is None:
                return
            for step in (1, 2):
                conn.execute(
                    "UPDATE raw_run SET step_index = %s, context = %s WHERE id = %s",
                    (step, f'{{"step": {step}}}', row[0]),
                )
            conn.execute(
                "UPDATE raw_run SET status = 'completed', finished_at = now() WHERE id = %s",
                (row[0],),
            )


def raw_cycle(db: str, n: int, connections: int) -> float:
    with connect(db) as conn:
        conn.execute("TRUNCATE raw_run")
        conn.execute("INSERT INTO raw_run (due_at) SELECT now() FROM generate_series(1, %s)", (n,))
        conn.execute("VACUUM ANALYZE raw_run")
    threads = [threading.Thread(target=_cycle, args=(db,)) for _ in range(connections)]
    with stopwatch() as elapsed:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    with connect(db) as conn:
        done = conn.execute("SELECT count(*) FROM raw_run WHERE status = 'completed'").fetchone()[0]
    if done != n:
        raise RuntimeError(f"raw cycle completed {done} of {n}")
    return rate(n, elapsed())


def main() -> None:
    args = suite_args(__doc__)
    results = Results()
    recreate_database(args.db)
    with connect(args.db) as conn:
        conn.execute(SCHEMA)
    for repeat in range(args.repeats):
        print(f"raw, repeat {repeat + 1}", flush=True)
        if wanted(args, "raw_insert"):
            results.add("raw_insert", raw_insert(args.db, args.n, f"r{repeat}"), "ops/s")
        for connections in (1, 4):
            name = f"raw_cycle_c{connections}"
            if wanted(args, name):
                results.add(name, raw_cycle(args.db, args.n, connections), "runs/s")
    results.write(args.out)


if __name__ == "__main__":
    main()
