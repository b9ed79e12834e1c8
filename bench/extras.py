"""The suites that are not part of the quick run, each behind its own flag of
``bench/run.py``: the scale suite (``--scale``), the soak (``--soak``) and many
producers (``--producers``). Each runs in its own process against a database of its
own; the soak on a PostgreSQL cluster of its own with autovacuum on
(``bench/cluster.py``). Their results go into ``latest.json`` beside the table's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from bench import cluster
from bench.common import ROOT, drop_database, migrate, recreate_database, suite_env

SOAK_PORT = int(os.environ.get("BENCH_SOAK_PORT", "5439"))
# The soak's cluster: autovacuum on, as in production; everything else the defaults.
SOAK_SERVER = {"autovacuum": "on", "shared_buffers": "128MB", "max_connections": "50"}


def _run(module: str, arguments: list[str], env: dict[str, str], timeout: float) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        path = out.name
    try:
        done = subprocess.run(
            [sys.executable, "-m", module, *arguments, "--out", path],
            cwd=ROOT,
            env=env,
            timeout=timeout,
        )
        if done.returncode != 0:
            return {"error": f"{module} exited {done.returncode}"}
        with open(path) as fh:
            return json.load(fh)
    except subprocess.TimeoutExpired:
        return {"error": f"{module} ran longer than {timeout:.0f}s"}
    finally:
        os.unlink(path)


def scale(sizes: str, n: int, keep: bool = False) -> dict:
    database = "bench_scale"
    recreate_database(database)
    env = suite_env(database)
    migrate(env)
    try:
        return _run("bench.scale_suite", ["--sizes", sizes, "--n", str(n)], env, 7200)
    finally:
        if not keep:
            drop_database(database)


def soak(minutes: float, rate: float, untuned: bool = False) -> dict:
    database = "bench_soak"
    arguments = ["--minutes", str(minutes), "--rate", str(rate)]
    if untuned:
        arguments.append("--untuned")
    timeout = minutes * 60 + 600
    if not cluster.available():
        env = suite_env(database)
        recreate_database(database)
        migrate(env)
        result = _run("bench.soak", arguments, env, timeout)
        result["server"] = "the shared server (pg_createcluster not found)"
        drop_database(database)
        return result
    with cluster.own_cluster(SOAK_PORT, SOAK_SERVER) as port:
        env = suite_env(database, PGPORT=str(port))
        recreate_database(database, port)
        migrate(env)
        result = _run("bench.soak", arguments, env, timeout)
        result["server"] = f"a cluster of its own (port {port}): {SOAK_SERVER}"
        return result


def producers(processes: int, seconds: float) -> dict:
    database = "bench_producers"
    recreate_database(database)
    env = suite_env(database)
    migrate(env)
    try:
        return _run(
            "bench.producers",
            ["--processes", str(processes), "--seconds", str(seconds)],
            env,
            seconds + 600,
        )
    finally:
        drop_database(database)
