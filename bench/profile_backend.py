"""Where the database's time goes per keyed start: our new key beside the peers'
(pgqueuer's enqueue with a new ``dedupe_key``, prepared and not, procrastinate's
``defer`` with a new ``queueing_lock``), sampled in each one's PostgreSQL
backends by ``perf``.

    python -m bench.profile_backend [--n 4000] [--libraries durable,pgqueuer]
    python -m bench.profile_backend --against /tmp/before   # this checkout and another

Each library runs in a process of its own, as in ``bench.duel`` (its database,
its connections); ``perf record -g -p <backends>`` samples their backends over
one block of ``--n`` new keys, and ``perf report --children`` says how much of
the backends' CPU each phase took, divided by the operations: the statement's
parsing, analysis and planning, the executor's setup, the CHECK constraints,
the index entries, the triggers, the commit with its WAL flush, and the
network. Needs Linux ``perf`` with the right to attach to the server's
processes (root, or ``kernel.perf_event_paranoid`` at most 1).
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import duel
from bench.common import connect, drop_database

# (label, the PostgreSQL functions whose inclusive time the phase is: alternatives of
# one code path, as the simple and the extended protocol call them, never nested)
PHASES = [
    ("the whole backend", ("PostgresMain",)),
    ("parsing the statement", ("pg_parse_query",)),
    (
        "analysing it (types, functions)",
        ("pg_analyze_and_rewrite_fixedparams", "pg_analyze_and_rewrite_varparams"),
    ),
    ("planning it", ("pg_plan_queries",)),
    ("running it", ("PortalRun",)),
    ("  executor setup", ("standard_ExecutorStart",)),
    ("  CHECK constraints", ("ExecConstraints",)),
    ("  index entries", ("ExecInsertIndexTuples",)),
    ("  triggers at the statement's end", ("AfterTriggerEndQuery",)),
    ("commit", ("CommitTransactionCommand",)),
    ("  deferred triggers (foreign keys)", ("AfterTriggerFireDeferred",)),
    ("  WAL flush", ("XLogFlush",)),
    ("reading the next message", ("pq_getbyte",)),
    ("sending the answer", ("__send",)),
]

REPORT_LINE = re.compile(r"\s*([\d.]+)%\s+[\d.]+%\s+\[.\]\s+(\S+)")


def backend_pids(database: str) -> str:
    """The client backends connected to ``database`` (the library's connections: one,
    or a pool's), comma-separated as ``perf -p`` takes them."""
    with connect("postgres") as conn:
        pids = [
            row[0]
            for row in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND backend_type = "
                "'client backend'",
                [database],
            )
        ]
    if not pids:
        raise RuntimeError(f"nothing is connected to {database}")
    return ",".join(map(str, pids))


def record(library: str, n: int, out: Path, against: Path | None = None) -> None:
    """Warm the library up, then sample its backends over one block of ``n`` new keys."""
    process = duel._start(library, against)
    try:
        duel._block(process, "new", 300, "warm")
        perf = subprocess.Popen(
            ["perf", "record", "-F", "2000", "-g", "-q", "-o", str(out)]
            + ["-p", backend_pids(duel.database(library))],
            stdout=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # attached (an idle backend gives no samples meanwhile)
        duel._block(process, "new", n, "profiled")
        perf.send_signal(signal.SIGINT)
        perf.wait(timeout=60)
    finally:
        process.stdin.close()
        process.wait(timeout=30)


def phases(path: Path, n: int) -> dict[str, float]:
    """Microseconds of the backends' CPU per operation, by phase."""
    report = subprocess.run(
        ["perf", "report", "-i", str(path), "--children", "--sort", "sym", "-g", "none", "--stdio"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    total_ns = float(re.search(r"Event count \(approx\.\): (\d+)", report).group(1))
    share = {}
    for line in report.splitlines():
        found = REPORT_LINE.match(line)
        if found:
            share.setdefault(found.group(2), float(found.group(1)))
    return {
        label: sum(share.get(symbol, 0.0) for symbol in symbols) / 100 * total_ns / 1000 / n
        for label, symbols in PHASES
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4000, help="new keys sampled per library")
    parser.add_argument("--libraries", help="comma-separated (default: all of them)")
    parser.add_argument(
        "--against",
        type=Path,
        help="another checkout of django-durable: profile it (durable_before) beside this one",
    )
    args = parser.parse_args()
    if shutil.which("perf") is None:
        sys.exit("perf is not installed (Debian: linux-perf)")
    against = args.against and args.against.resolve()
    every = duel.VERSIONS if against else duel.PEERS
    libraries = args.libraries.split(",") if args.libraries else list(every)
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for library in libraries:
            duel._prepare(library, against)
            try:
                path = Path(tmp) / f"{library}.data"
                record(library, args.n, path, against)
                found[library] = phases(path, args.n)
            finally:
                drop_database(duel.database(library))
    print(f"µs of the backend's CPU per new key ({args.n} each)")
    width = max(15, *(len(library) + 2 for library in libraries))
    print(f"{'':36}" + "".join(f"{library:>{width}}" for library in libraries))
    for label, _symbols in PHASES:
        print(f"{label:36}" + "".join(f"{found[lib][label]:{width}.1f}" for lib in libraries))


if __name__ == "__main__":
    main()
