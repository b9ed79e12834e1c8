"""Benchmarks of django-durable side by side with raw PostgreSQL and the peer libraries.

    python bench/run.py              # N=5000, 3 repeats, medians; writes bench/results/latest.json
    python bench/run.py --quick      # N=500, one repeat: the CI smoke test (asserts no speed)
    python bench/run.py --scale --soak --producers   # and the suites of bench/extras.py
    python bench/run.py --skip-main --soak --soak-minutes 2   # one of them alone, shorter

Every suite runs in its own process against its own throwaway database (dropped and
created again). Repeats are interleaved (raw, ours, peers, raw, ours, peers...) so a
load change on a shared machine touches every column alike: compare ratios, not
absolute numbers. A peer that is not installed or fails is reported missing.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import extras, report, report_extras  # noqa: E402
from bench.common import (  # noqa: E402
    connect,
    drop_database,
    migrate,
    recreate_database,
    suite_env,
)

# (name, module, database, package that must be importable)
SUITES = [
    ("raw", "bench.raw_suite", "bench_raw", None),
    ("django-durable", "bench.durable_suite", "bench_durable", None),
    # The same migrated database: each suite empties the tables it measures.
    ("django-durable start_many", "bench.batch_suite", "bench_durable", None),
    ("procrastinate", "bench.peer_procrastinate", "bench_procrastinate", "procrastinate"),
    ("pgqueuer", "bench.peer_pgqueuer", "bench_pgqueuer", "pgqueuer"),
    ("dbos", "bench.peer_dbos", "bench_dbos", "dbos"),
    ("celery", "bench.peer_celery", "bench_celery", "celery_once"),
    ("django-tasks-db", "bench.peer_tasks_db", "bench_tasks_db", "django_tasks_db"),
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, help="operations per measurement (default 5000)")
    parser.add_argument("--repeats", type=int, help="repeats; the median is reported (default 3)")
    parser.add_argument("--quick", action="store_true", help="N=500, one repeat, peers optional")
    parser.add_argument("--no-peers", action="store_true", help="only raw PostgreSQL and ours")
    parser.add_argument("--only", default="", help="comma-separated metric names")
    parser.add_argument("--json", help="where to write the results")
    parser.add_argument("--keep-databases", action="store_true")
    extra = parser.add_argument_group("the suites outside the quick run (bench/extras.py)")
    extra.add_argument("--scale", action="store_true", help="the scale suite")
    extra.add_argument("--scale-sizes", default="0,1000000,5000000")
    extra.add_argument("--scale-n", type=int, default=2000, help="operations per figure")
    extra.add_argument("--soak", action="store_true", help="the soak")
    extra.add_argument("--soak-minutes", type=float, default=10)
    extra.add_argument("--soak-rate", type=float, default=150, help="starts per second")
    extra.add_argument("--soak-untuned", action="store_true", help="no autovacuum settings")
    extra.add_argument("--producers", action="store_true", help="8 producer processes")
    extra.add_argument("--producer-seconds", type=float, default=30)
    extra.add_argument("--skip-main", action="store_true", help="only the suites above")
    args = parser.parse_args()
    args.n = args.n or (500 if args.quick else 5000)
    args.repeats = args.repeats or (1 if args.quick else 3)
    default_json = "quick.json" if args.quick else "latest.json"
    # A run written elsewhere (--json) is a look, not a record: docs/ stay as they are.
    args.records = args.json is None
    args.json = args.json or str(ROOT / "bench" / "results" / default_json)
    return args


def prepare_durable(database: str) -> None:
    recreate_database(database)
    migrate(suite_env(database))


def run_suite(module: str, database: str, args, timeout: float) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        path = out.name
    command = [
        sys.executable,
        "-m",
        module,
        "--n",
        str(args.n),
        "--repeats",
        "1",
        "--db",
        database,
        "--out",
        path,
    ]
    if args.quick:
        command.append("--quick")
    if args.only:
        command += ["--only", args.only]
    try:
        done = subprocess.run(command, cwd=ROOT, env=suite_env(database), timeout=timeout)
        if done.returncode != 0:
            return {"error": f"{module} exited {done.returncode}"}
        with open(path) as fh:
            return json.load(fh)
    except subprocess.TimeoutExpired:
        return {"error": f"{module} ran longer than {timeout:.0f}s"}
    finally:
        os.unlink(path)


def machine(args) -> dict:
    with connect("postgres") as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
        sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    versions = {}
    for package in (
        "django",
        "psycopg",
        "procrastinate",
        "pgqueuer",
        "dbos",
        "celery",
        "celery-once",
        "redis",
        "django-tasks",
        "django-tasks-db",
    ):
        try:
            from importlib.metadata import version

            versions[package] = version(package)
        except Exception:
            versions[package] = None
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "postgresql": server,
        "synchronous_commit": sync,
        "versions": versions,
        "commit": commit,
        "n": args.n,
        "repeats": args.repeats,
        "quick": args.quick,
    }


def run_extras(args) -> dict:
    """The suites of ``bench/extras.py`` that were asked for, in this order."""
    out: dict = {}
    if args.scale:
        print(f"== scale suite ({args.scale_sizes} runs, N={args.scale_n})", flush=True)
        out["scale"] = extras.scale(args.scale_sizes, args.scale_n, keep=args.keep_databases)
    if args.producers:
        print("== many producers", flush=True)
        out["producers"] = extras.producers(8, args.producer_seconds)
    if args.soak:
        print(f"== soak ({args.soak_minutes:g} minutes)", flush=True)
        out["soak"] = extras.soak(args.soak_minutes, args.soak_rate, untuned=args.soak_untuned)
    return out


def main() -> int:
    args = parse_args()
    info = machine(args)
    timeout = 600 if args.quick else 3600
    merged: dict[str, dict] = {}
    missing: dict[str, str] = {}
    suites = []
    for name, module, database, package in SUITES:
        if package is not None and args.no_peers:
            continue
        if package is not None and importlib.util.find_spec(package) is None:
            for metric in report.SUITE_METRICS[name]:
                missing[metric] = f'{package} is not installed (pip install -e ".[bench]")'
            continue
        suites.append((name, module, database))
    if args.skip_main:
        suites = []
    else:
        prepare_durable("bench_durable")
    for repeat in range(args.repeats if suites else 0):
        for name, module, database in suites:
            print(f"== {name} (repeat {repeat + 1} of {args.repeats}, N={args.n})", flush=True)
            result = run_suite(module, database, args, timeout)
            if "error" in result:
                for metric in report.SUITE_METRICS[name]:
                    missing.setdefault(metric, result["error"])
                continue
            for metric, entry in result["metrics"].items():
                merged.setdefault(metric, {"unit": entry["unit"], "runs": []})
                merged[metric]["runs"] += entry["runs"]
            for metric, reason in result["missing"].items():
                missing.setdefault(metric, reason)
    if not args.keep_databases:
        for _name, _module, database in suites:
            drop_database(database)
    metrics = {}
    for metric in report.ORDER:
        if metric in merged:
            entry = merged[metric]
            metrics[metric] = {
                "value": round(statistics.median(entry["runs"]), 3),
                "unit": entry["unit"],
                "runs": entry["runs"],
            }
    for metric in metrics:
        missing.pop(metric, None)
    targets = report.targets(metrics)
    table = report.markdown(metrics, missing, targets)
    if metrics:
        for pairs in (report.LIKE_FOR_LIKE, report.DJANGO_PEERS):
            table += "\n\n" + report.pairs_markdown(metrics, missing, pairs)
    print()
    print(table)
    recorded = {"machine": info, "metrics": metrics, "missing": missing, "targets": targets}
    recorded.update(run_extras(args))
    recorded["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(recorded, fh, indent=1, default=str)
        fh.write("\n")
    print(f"\nwrote {os.path.relpath(args.json, ROOT)}")
    if args.records and not args.quick and not args.only:
        docs = ROOT / "docs" / "benchmarks.md"
        if metrics:
            report.update_docs(docs, info, table)
        if "soak" in recorded:
            # matplotlib is a bench extra: only the soak needs it.
            from bench import plots

            plots.soak_curves(recorded["soak"], ROOT / "docs" / "img")
        report_extras.update_docs(docs, recorded)
    # The smoke test: every metric of ours and of raw PostgreSQL was measured.
    # A checkout without the worker command cannot measure the worker: said, not failed.
    ours_missing = [
        m for m in report.OURS_AND_RAW if m in missing and "not in this checkout" not in missing[m]
    ]
    if args.only:
        ours_missing = [m for m in ours_missing if m in args.only.split(",")]
    if ours_missing:
        print(f"not measured: {', '.join(ours_missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
