"""Shared helpers of the benchmark suites: databases, timing, results."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent

PG = {
    "host": os.environ.get("PGHOST", "127.0.0.1"),
    "port": int(os.environ.get("PGPORT", "5432")),
    "user": os.environ.get("PGUSER", "postgres"),
}


def dsn(dbname: str) -> str:
    return f"postgresql://{PG['user']}@{PG['host']}:{PG['port']}/{dbname}"


def connect(dbname: str, *, autocommit: bool = True, port: int | None = None) -> psycopg.Connection:
    return psycopg.connect(
        dbname=dbname, autocommit=autocommit, **{**PG, "port": port or PG["port"]}
    )


def recreate_database(dbname: str, port: int | None = None) -> None:
    """Drop and create ``dbname``: every benchmark starts from an empty database."""
    with connect("postgres", port=port) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{dbname}"')


def suite_env(database: str, **extra: str) -> dict[str, str]:
    """The environment of a suite's process: this checkout importable, the bench's
    settings, ``database`` as the one django-durable uses, and ``extra``."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "BENCH_DB_NAME": database,
        **extra,
    }


def migrate(env: dict[str, str], cwd: Path = ROOT) -> None:
    """``manage.py migrate`` on the database of ``env`` (a ``suite_env``), with the
    code and migrations of the checkout ``cwd`` (this one by default)."""
    subprocess.run(
        [sys.executable, str(cwd / "manage.py"), "migrate", "-v", "0"],
        cwd=cwd,
        env=env,
        check=True,
    )


def drop_database(dbname: str) -> None:
    with connect("postgres") as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


@contextmanager
def stopwatch():
    """``with stopwatch() as elapsed: ...`` then ``elapsed()`` is the seconds it took."""
    start = time.perf_counter()
    end: list[float] = []
    yield lambda: (end[0] if end else time.perf_counter()) - start
    end.append(time.perf_counter())


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (``pct`` in 0..100)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(pct / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


class Results:
    """Collects the runs of each metric of one suite; written as JSON for ``run.py``."""

    def __init__(self) -> None:
        self.metrics: dict[str, dict] = {}
        self.missing: dict[str, str] = {}

    def add(self, name: str, value: float, unit: str) -> None:
        entry = self.metrics.setdefault(name, {"unit": unit, "runs": []})
        entry["runs"].append(round(value, 3))
        print(f"  {name}: {value:,.1f} {unit}", flush=True)

    def miss(self, names: list[str], reason: str) -> None:
        for name in names:
            self.missing[name] = reason
        print(f"  missing {', '.join(names)}: {reason}", flush=True)

    def measure(self, names: list[str], fn: Callable[[], None]) -> None:
        """Run ``fn``; a failure marks ``names`` missing instead of stopping the suite."""
        try:
            fn()
        except Exception as exc:  # a peer or a step that fails is reported, never faked
            self.miss(names, f"{type(exc).__name__}: {exc}".splitlines()[0][:300])

    def write(self, path: str) -> None:
        for entry in self.metrics.values():
            entry["value"] = round(statistics.median(entry["runs"]), 3)
        with open(path, "w") as fh:
            json.dump({"metrics": self.metrics, "missing": self.missing}, fh, indent=1)


def suite_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--db", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="", help="comma-separated metric names")
    return parser.parse_args()


def wanted(args: argparse.Namespace, *names: str) -> bool:
    only = {n for n in args.only.split(",") if n}
    return not only or bool(only.intersection(names))
