"""A PostgreSQL cluster of the benchmark's own, on another port, for the soak.

The shared server of a development machine may run with autovacuum off (tests
are faster without it); a soak measures what autovacuum does to a queue table, so
it runs on a cluster configured as production is: autovacuum on, the server's
defaults otherwise. Made with ``pg_createcluster`` (Debian's postgresql-common),
dropped afterwards. Without those tools the soak runs on the given server and says
so in its results.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

NAME = "durable_bench_soak"


def available() -> bool:
    return all(shutil.which(t) for t in ("pg_createcluster", "pg_dropcluster", "pg_lsclusters"))


def version() -> str:
    out = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def drop(version: str, name: str = NAME) -> None:
    subprocess.run(
        ["pg_dropcluster", version, name, "--stop"], capture_output=True, text=True, check=False
    )


@contextmanager
def own_cluster(port: int, options: dict[str, str], name: str = NAME) -> Iterator[int]:
    """A fresh cluster ``name`` on ``port`` with ``options`` (postgresql.conf settings);
    ``tests/own_cluster.py`` makes one per test under a name of its own."""
    release = version()
    drop(release, name)  # what a previous, interrupted run left
    command = ["pg_createcluster", release, name, "-p", str(port), "--start"]
    for setting, value in options.items():
        command += ["-o", f"{setting}={value}"]
    subprocess.run([*command, "--", "--auth=trust"], capture_output=True, text=True, check=True)
    try:
        yield port
    finally:
        drop(release, name)
