"""A PostgreSQL cluster of one test's own, on a free port, that the test may restart.

The shared server is never restarted by a test: a test that needs PostgreSQL to go
away and come back makes a cluster of its own with ``bench/cluster.py`` (Debian's
``pg_createcluster``, trust authentication), restarts it with ``pg_ctlcluster`` and
drops it at the end. Processes reach it through the environment ``tests/settings.py``
reads (``DURABLE_TEST_PORT``, ``DURABLE_SUBPROCESS_DB_NAME``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DatabaseError, connections

from bench import cluster
from tests.pgbouncer import free_port
from tests.worker_processes import ROOT

# Durability is not what these tests are about: a restart checkpoints anyway.
FAST = {"fsync": "off", "full_page_writes": "off", "max_connections": "100"}


class OwnCluster:
    def __init__(self, name: str, port: int, release: str, database: str):
        self.name, self.port, self.release, self.database = name, port, release, database

    def ctl(self, action: str) -> None:
        """``pg_ctlcluster`` start, stop or restart (fast: open sessions are ended)."""
        subprocess.run(
            ["pg_ctlcluster", "-m", "fast", self.release, self.name, action],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )

    def restart(self) -> None:
        self.ctl("restart")

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a process whose "default" database is this cluster's."""
        return {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DURABLE_TEST_DB": "postgres",
            "DURABLE_SUBPROCESS_DB_NAME": self.database,
            "DURABLE_TEST_PORT": str(self.port),
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            **extra,
        }

    def python(self, *args: str, timeout: float = 300) -> str:
        """Run ``python *args`` in the project against this cluster; return its stdout."""
        done = subprocess.run(
            [sys.executable, *args],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stderr}"
        return done.stdout

    def scalar(self, sql: str) -> object | None:
        """One value read through a Django connection of the test's own to this cluster;
        None while the cluster is out of reach (restarting)."""
        if getattr(self, "_wrapper", None) is None:
            default = connections["default"]
            settings = {**default.settings_dict, "NAME": self.database, "PORT": self.port}
            self._wrapper = type(default)(settings, alias=f"own_cluster_{self.name}")
        try:
            with self._wrapper.cursor() as cursor:
                cursor.execute(sql)
                return cursor.fetchone()[0]
        except DatabaseError:
            self._wrapper.close()
            return None

    def close(self) -> None:
        if getattr(self, "_wrapper", None) is not None:
            self._wrapper.close()

    def probe(self, *args: str) -> dict:
        """``python -m tests.cluster_probe *args``: the last line it printed, as JSON."""
        return json.loads(self.python("-m", "tests.cluster_probe", *args).strip().splitlines()[-1])


@contextmanager
def own_cluster(purpose: str, options: dict[str, str] | None = None) -> Iterator[OwnCluster]:
    """A started cluster ``durable_<purpose>_<pid>`` with a migrated database ``durable``."""
    name = f"durable_{purpose}_{os.getpid()}"
    port = free_port()
    with cluster.own_cluster(port, {**FAST, **(options or {})}, name=name):
        subprocess.run(
            ["createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "durable"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        own = OwnCluster(name, port, cluster.version(), "durable")
        own.python("manage.py", "migrate", "--run-syncdb", "--verbosity", "0")
        try:
            yield own
        finally:
            own.close()


def available() -> bool:
    return cluster.available()
