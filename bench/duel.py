"""Keyed starts side by side in time: ours and the peers', in alternating blocks.

``bench/run.py`` measures each library in a process of its own, one after the
other, so two figures it divides were taken minutes apart; on a shared machine
whose disk and neighbours move, the ratio of one repeat has ranged from 0.7x to
1.5x between the same two libraries in one run. The duel keeps one process per
library open and has them run blocks of ``--n`` operations in turn, the order
rotating each round, so every library meets the same conditions within a second
or two. Each round gives one ratio per pair; the report gives their median and
quartiles.

Per library, on a database of its own:

- ``durable``: ``durable.start(wf, input, key=new)``, then the same keys again
  (each answered by its holder, ``use_existing``);
- ``pgqueuer``: ``enqueue`` with a new ``dedupe_key``, then the same keys again
  (``DuplicateJobError``);
- ``pgqueuer_unprepared``: the same on a connection that prepares nothing
  (``prepare_threshold=None``, as behind PgBouncer in transaction mode): each
  enqueue parsed and planned at every call, as a start's statement is with
  Django's defaults;
- ``procrastinate``: ``defer`` with a new ``queueing_lock``, then the same locks
  again (``AlreadyEnqueued``).

Run: ``python -m bench.duel [--rounds 12] [--n 300] [--json PATH]`` (the peers
from ``pip install -e ".[bench]"``).

``--against CHECKOUT`` duels this checkout with another checkout of django-durable
instead of the peers (``git worktree add /tmp/before <commit>``): ``durable_before``
is the other checkout's own ``durable`` process, its code and its migrations, on a
database of its own, so a change is measured before and after under the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ROOT, drop_database, dsn, migrate, recreate_database, suite_env

PEERS = ("durable", "pgqueuer", "pgqueuer_unprepared", "procrastinate")
# (ours, the peer, kind): the ratios reported, ours over the peer's rate.
PAIRS = [
    ("durable", "pgqueuer", "new"),
    ("durable", "pgqueuer_unprepared", "new"),
    ("durable", "procrastinate", "new"),
    ("durable", "pgqueuer", "dup"),
    ("durable", "pgqueuer_unprepared", "dup"),
    ("durable", "procrastinate", "dup"),
]
# With --against: this checkout and the other one.
VERSIONS = ("durable", "durable_before")
VERSION_PAIRS = [("durable", "durable_before", "new"), ("durable", "durable_before", "dup")]


def database(library: str) -> str:
    return f"bench_duel_{library}"


# --- one library's process ------------------------------------------------------


def durable_operations():
    import django

    django.setup()
    import django_durable as durable
    from bench.workflows import BenchKeyed

    def new(n: int, tag: str) -> None:
        for i in range(n):
            durable.start(BenchKeyed, {"i": i}, key=f"{tag}:{i}")

    def dup(n: int, tag: str) -> None:
        for i in range(n):
            result = durable.start_detailed(BenchKeyed, {"i": i}, key=f"{tag}:{i}")
            if result.outcome != "use_existing":
                raise RuntimeError(f"a duplicate start was answered by {result.outcome}")

    return new, dup


def pgqueuer_operations(library: str = "pgqueuer", prepare_threshold: int | None = 5):
    import psycopg
    from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver
    from pgqueuer.domain.errors import DuplicateJobError
    from pgqueuer.queries import SyncQueries

    from bench.peer_pgqueuer import install

    db = database(library)
    asyncio.run(install(db))
    connection = psycopg.connect(dsn(db), autocommit=True, prepare_threshold=prepare_threshold)
    queries = SyncQueries(SyncPsycopgDriver(connection))

    def new(n: int, tag: str) -> None:
        for i in range(n):
            queries.enqueue("noop", b"%d" % i, dedupe_key=f"{tag}:{i}")

    def dup(n: int, tag: str) -> None:
        for i in range(n):
            try:
                queries.enqueue("noop", b"%d" % i, dedupe_key=f"{tag}:{i}")
            except DuplicateJobError:
                continue
            raise RuntimeError("a duplicate enqueue was accepted")

    return new, dup


def procrastinate_operations():
    import procrastinate

    from bench.peer_procrastinate import make_app

    app = make_app(database("procrastinate"))
    app.open()
    app.schema_manager.apply_schema()
    noop = app.tasks["noop"]

    def new(n: int, tag: str) -> None:
        for i in range(n):
            noop.configure(queueing_lock=f"{tag}:{i}").defer(i=i)

    def dup(n: int, tag: str) -> None:
        for i in range(n):
            try:
                noop.configure(queueing_lock=f"{tag}:{i}").defer(i=i)
            except procrastinate.exceptions.AlreadyEnqueued:
                continue
            raise RuntimeError("a duplicate defer was accepted")

    return new, dup


def serve(library: str) -> None:
    """Set ``library`` up, say "ready", then run each "KIND N TAG" line read from
    stdin and answer the seconds it took and the CPU seconds this process spent."""
    operations = {
        "durable": durable_operations,
        "pgqueuer": pgqueuer_operations,
        "pgqueuer_unprepared": lambda: pgqueuer_operations("pgqueuer_unprepared", None),
        "procrastinate": procrastinate_operations,
    }[library]()
    kinds = dict(zip(("new", "dup"), operations, strict=True))
    print("ready", flush=True)
    for line in sys.stdin:
        kind, n, tag = line.split()
        began, cpu = time.perf_counter(), time.process_time()
        kinds[kind](int(n), tag)
        print(time.perf_counter() - began, time.process_time() - cpu, flush=True)


# --- the controller -------------------------------------------------------------


def _checkout(library: str, against: Path | None = None) -> Path:
    """The checkout whose code serves ``library``."""
    return against if library == "durable_before" else ROOT


def _env(library: str, against: Path | None = None) -> dict[str, str]:
    env = suite_env(database(library))
    env["PYTHONPATH"] = str(_checkout(library, against))
    return env


def _prepare(library: str, against: Path | None = None) -> None:
    recreate_database(database(library))
    if library.startswith("durable"):
        migrate(_env(library, against), cwd=_checkout(library, against))


def _start(library: str, against: Path | None = None) -> subprocess.Popen:
    # The other checkout serves its own code as ``durable``.
    served = "durable" if library == "durable_before" else library
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.duel", "--serve", served],
        cwd=_checkout(library, against),
        env=_env(library, against),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    if process.stdout.readline().strip() != "ready":
        raise RuntimeError(f"{library} did not start")
    return process


def _block(process: subprocess.Popen, kind: str, n: int, tag: str) -> tuple[float, float]:
    """One block: (operations per second, microseconds of the process's CPU per operation)."""
    process.stdin.write(f"{kind} {n} {tag}\n")
    process.stdin.flush()
    answer = process.stdout.readline()
    if not answer:
        raise RuntimeError(f"a {kind} block failed")
    seconds, cpu = map(float, answer.split())
    return n / seconds, cpu / n * 1e6


PerRound = dict[str, dict[str, list[float]]]  # library -> kind -> one figure per round


def _per_round(libraries: tuple[str, ...]) -> PerRound:
    return {library: {"new": [], "dup": []} for library in libraries}


def _medians(figures: PerRound) -> dict[str, dict[str, float]]:
    return {
        library: {kind: round(statistics.median(v), 1) for kind, v in kinds.items()}
        for library, kinds in figures.items()
    }


def duel(rounds: int, n: int, against: Path | None = None) -> dict:
    """Rates (ops/s) and CPU per operation (µs, in the library's process) of each
    library and kind per round, and the ratios of PAIRS (of VERSION_PAIRS when
    ``against`` names another checkout)."""
    libraries, pairs = (VERSIONS, VERSION_PAIRS) if against else (PEERS, PAIRS)
    for library in libraries:
        _prepare(library, against)
    processes = {library: _start(library, against) for library in libraries}
    rates, cpu = _per_round(libraries), _per_round(libraries)
    try:
        for r in range(rounds):
            order = libraries[r % len(libraries) :] + libraries[: r % len(libraries)]
            for kind in ("new", "dup"):
                for library in order:
                    rate, used = _block(processes[library], kind, n, f"r{r}")
                    rates[library][kind].append(rate)
                    cpu[library][kind].append(used)
            print(
                f"round {r + 1}: "
                + ", ".join(f"{lib} {rates[lib]['new'][-1]:,.0f}/s" for lib in libraries),
                flush=True,
            )
    finally:
        for process in processes.values():
            process.stdin.close()
            process.wait(timeout=30)
        for library in libraries:
            drop_database(database(library))
    ratios = {}
    for ours, peer, kind in pairs:
        each = [a / b for a, b in zip(rates[ours][kind], rates[peer][kind], strict=True)]
        q1, median, q3 = statistics.quantiles(each, n=4)
        ratios[f"{ours}_{kind} / {peer}_{kind}"] = {
            "median": round(statistics.median(each), 3),
            "quartiles": [round(q1, 3), round(q3, 3)],
            "rounds": [round(x, 3) for x in each],
        }
    return {
        "rounds": rounds,
        "n": n,
        "rates": _medians(rates),
        "cpu_us": _medians(cpu),
        "ratios": ratios,
    }


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--n", type=int, default=300, help="operations per block")
    parser.add_argument("--json", help="where to write the results")
    parser.add_argument(
        "--against", type=Path, help="another checkout of django-durable to duel with"
    )
    args = parser.parse_args()
    found = duel(args.rounds, args.n, args.against and args.against.resolve())
    for library in found["rates"]:
        rate, used = found["rates"][library], found["cpu_us"][library]
        print(
            f"{library}: new {rate['new']:,.0f}/s ({used['new']:.0f} µs CPU each), "
            f"duplicate {rate['dup']:,.0f}/s ({used['dup']:.0f} µs CPU each)"
        )
    for name, ratio in found["ratios"].items():
        low, high = ratio["quartiles"]
        print(f"{name}: {ratio['median']:.2f}x (quartiles {low:.2f}-{high:.2f})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(found, fh, indent=1)


if __name__ == "__main__":
    main()
