"""What replay and repair costs a start and a 2-step run: two checkouts side by side.

Each round measures, in each checkout (the order alternating), on a database of its
own: ``n`` keyed starts of new keys (this process's CPU time and wall time per
start), then ``n`` runs of ``bench_two_steps`` through one burst worker with
``--concurrency 4`` (the worker process's CPU time per run). CPU time is less
disturbed than wall time by a busy machine; both are reported. The medians of the
rounds are compared.

Run: ``python bench/replay_cost.py BASE_CHECKOUT [--rounds 10] [--n 1500]`` from
this checkout (``git archive main | tar -x -C /tmp/base`` makes BASE_CHECKOUT).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
METRICS = ("start_cpu_us", "start_wall_us", "worker_cpu_us_per_run")


def one(n: int, tag: str) -> dict:
    """One measurement in this process's checkout (``--one``)."""
    import django_durable as durable
    from bench import durable_suite as suite  # django.setup()

    suite.truncate()
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(n):
        durable.start("bench_two_steps", {"i": i}, key=f"{tag}:{i}")
    start_cpu, start_wall = (time.process_time() - cpu) / n, (time.perf_counter() - wall) / n
    suite.truncate()
    suite.enqueue("bench_two_steps", n)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = suite.worker_command("--concurrency", "4", "--burst")
    subprocess.run(command, cwd=suite.ROOT, env=os.environ, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "start_cpu_us": start_cpu * 1e6,
        "start_wall_us": start_wall * 1e6,
        "worker_cpu_us_per_run": worker / n * 1e6,
    }


def _env(tree: str, database: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": tree,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "BENCH_DB_NAME": database,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("base", nargs="?")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--n", type=int, default=1500)
    parser.add_argument("--one", metavar="TAG")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.n, args.one)))
        return
    from bench.common import recreate_database

    trees = {"base": str(Path(args.base).resolve()), "this": str(HERE)}
    for name, tree in trees.items():
        recreate_database(f"bench_replay_{name}")
        manage = [sys.executable, f"{tree}/manage.py", "migrate", "-v", "0"]
        subprocess.run(manage, cwd=tree, env=_env(tree, f"bench_replay_{name}"), check=True)
    results: dict[str, list[dict]] = {name: [] for name in trees}
    for n in range(args.rounds):
        for name in list(trees) if n % 2 == 0 else list(reversed(trees)):
            tree = trees[name]
            command = [sys.executable, str(HERE / "bench" / "replay_cost.py"), "--n", str(args.n)]
            done = subprocess.run(
                [*command, "--one", f"r{n}"],
                cwd=tree,
                env=_env(tree, f"bench_replay_{name}"),
                check=True,
                capture_output=True,
                text=True,
            )
            results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(n, name, results[name][-1], flush=True)
    for metric in METRICS:
        base = statistics.median(r[metric] for r in results["base"])
        this = statistics.median(r[metric] for r in results["this"])
        print(f"{metric}: base {base:.0f}, this {this:.0f}, this/base {this / base:.3f}")


if __name__ == "__main__":
    main()
