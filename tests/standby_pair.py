"""A primary and a synchronous streaming standby of one test's own, for failover tests.

Both clusters are made with Debian's ``pg_createcluster`` on free ports, never the
shared server: the primary with ``synchronous_standby_names = '*'`` (a commit returns
only once the standby has it: a committed start survives the failover), the standby
from ``pg_basebackup -R`` (it streams from the primary). ``stop_primary`` stops the
primary hard (``-m immediate``: a crash); ``promote`` runs ``pg_ctl promote`` on the
standby (through ``pg_ctlcluster``). Both are dropped at the end, whatever happened.
Processes reach the pair through libpq's multi-host settings: ``HOST`` and ``PORT``
list both servers and ``target_session_attrs=read-write`` picks the one that accepts
writes.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench import cluster
from tests.pgbouncer import free_port
from tests.worker_processes import ROOT

# What the docs recommend for a worker (docs/production.md, "High availability"):
# find the writable server, give up on a dead host within seconds, and notice a
# silent link within seconds (keepalives, and tcp_user_timeout for unacknowledged data).
HA_OPTIONS = {
    "target_session_attrs": "read-write",
    "connect_timeout": "2",
    "keepalives": "1",
    "keepalives_idle": "2",
    "keepalives_interval": "1",
    "keepalives_count": "3",
    "tcp_user_timeout": "5000",
}
# Durability on disk is not what these tests are about (an immediate stop loses no
# data the OS has), replication is: full_page_writes stays on for pg_basebackup.
PRIMARY = {
    "fsync": "off",
    "max_connections": "100",
    "wal_level": "replica",
    "max_wal_senders": "5",
}


def _run(*command: str, user: str | None = None, timeout: float = 120) -> str:
    if user is not None:
        command = ("runuser", "-u", user, "--", *command)
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr}")
    return done.stdout


def psql(port: int, sql: str, database: str = "postgres") -> str:
    """One statement on the server at ``port``; its output, unaligned."""
    return _run(
        "psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", database,
        "-XAtc", sql, timeout=60,
    ).strip()  # fmt: skip


class StandbyPair:
    def __init__(self, purpose: str):
        self.release = cluster.version()
        self.primary = f"durable_{purpose}_p_{os.getpid()}"
        self.standby = f"durable_{purpose}_s_{os.getpid()}"
        self.primary_port = free_port()
        self.standby_port = free_port()
        self.database = "durable"

    # --- making and dropping --------------------------------------------------

    def create(self) -> None:
        self.drop()  # what an interrupted run left
        command = ["pg_createcluster", self.release, self.primary, "-p", str(self.primary_port)]
        for setting, value in PRIMARY.items():
            command += ["-o", f"{setting}={value}"]
        _run(*command, "--start", "--", "--auth=trust")
        _run(
            "createdb", "-h", "127.0.0.1", "-p", str(self.primary_port), "-U", "postgres",
            self.database,
        )  # fmt: skip
        _run(
            "pg_createcluster", self.release, self.standby, "-p", str(self.standby_port),
            "-o", "fsync=off", "-o", "max_connections=100", "-o", "hot_standby=on",
            "--", "--auth=trust",
        )  # fmt: skip
        data = Path(f"/var/lib/postgresql/{self.release}/{self.standby}")
        shutil.rmtree(data)
        data.mkdir(mode=0o700)
        postgres = pwd.getpwnam("postgres")
        os.chown(data, postgres.pw_uid, postgres.pw_gid)
        _run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary_port), "-U", "postgres",
            "-D", str(data), "-R", "-X", "stream", "-c", "fast",
            user="postgres",
        )  # fmt: skip
        self.ctl(self.standby, "start")
        # Synchronous from now on (before, createdb and the base backup would wait for
        # a standby that did not exist yet).
        psql(self.primary_port, "ALTER SYSTEM SET synchronous_standby_names = '*'")
        psql(self.primary_port, "SELECT pg_reload_conf()")
        deadline = time.monotonic() + 60
        while psql(self.primary_port, "SELECT count(*) FROM pg_stat_replication "
                   "WHERE sync_state = 'sync'") != "1":  # fmt: skip
            if time.monotonic() > deadline:
                raise AssertionError("the standby never became synchronous")
            time.sleep(0.1)

    def drop(self) -> None:
        for name in (self.primary, self.standby):
            cluster.drop(self.release, name)

    def ctl(self, name: str, action: str, *options: str) -> None:
        _run("pg_ctlcluster", *options, self.release, name, action)

    # --- the failover ----------------------------------------------------------

    def stop_primary(self) -> None:
        """Stop the primary as a crash would: no checkpoint, sessions cut."""
        self.ctl(self.primary, "stop", "-m", "immediate")

    def promote(self) -> None:
        """``pg_ctl promote`` on the standby (it waits until the standby accepts writes)."""
        self.ctl(self.standby, "promote")

    def in_recovery(self, port: int) -> bool:
        return psql(port, "SELECT pg_is_in_recovery()", self.database) == "t"

    # --- processes -------------------------------------------------------------

    def env(self, *, hosts: str = "both", options: dict | None = None, **extra: str) -> dict:
        """The environment of a process whose "default" database is the pair's:
        ``hosts`` "both" (multi-host, the primary first), "primary" or "standby"."""
        ports = {
            "both": f"{self.primary_port},{self.standby_port}",
            "primary": str(self.primary_port),
            "standby": str(self.standby_port),
        }[hosts]
        host = ",".join(["127.0.0.1"] * len(ports.split(",")))
        return {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DURABLE_TEST_DB": "postgres",
            "DURABLE_SUBPROCESS_DB_NAME": self.database,
            "PGHOST": host,
            "DURABLE_TEST_PORT": ports,
            "DURABLE_TEST_DB_OPTIONS": json.dumps(HA_OPTIONS if options is None else options),
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            **extra,
        }

    def python(self, *args: str, timeout: float = 300) -> str:
        done = subprocess.run(
            [sys.executable, *args],
            cwd=ROOT,
            env=self.env(hosts="primary"),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stderr}"
        return done.stdout

    def probe(self, *args: str, hosts: str = "both") -> dict:
        """``python -m tests.cluster_probe *args`` through ``hosts``: its last line, as JSON."""
        done = subprocess.run(
            [sys.executable, "-m", "tests.cluster_probe", *args],
            cwd=ROOT,
            env=self.env(hosts=hosts),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stderr}"
        return json.loads(done.stdout.strip().splitlines()[-1])

    def count(self, port: int, sql: str) -> int | None:
        """One number read from the server at ``port``; None while it is out of reach."""
        try:
            return int(psql(port, sql, self.database))
        except AssertionError:
            return None


@contextmanager
def standby_pair(purpose: str) -> Iterator[StandbyPair]:
    """A primary with a synchronous standby, the package's tables migrated on it."""
    pair = StandbyPair(purpose)
    try:
        pair.create()
        pair.python("manage.py", "migrate", "--run-syncdb", "--verbosity", "0")
        yield pair
    finally:
        pair.drop()


def available() -> bool:
    return cluster.available() and all(
        shutil.which(tool) for tool in ("pg_basebackup", "runuser", "psql")
    )
