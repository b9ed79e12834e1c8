"""A PgBouncer of the test's own, in front of the local PostgreSQL.

It listens on a free port of 127.0.0.1, in the pool mode the test asks for, with
its configuration and log in a temporary directory, and stops with the test.
Authentication is ``trust``, like the local PostgreSQL it forwards to. PgBouncer
refuses to run as root; as root (CI) it drops to the ``postgres`` user after it has
read its configuration.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PgBouncer:
    def __init__(
        self,
        directory: Path,
        *,
        pool_mode: str = "transaction",
        server_port: int = 5432,
        user: str = "postgres",
        pool_size: int = 10,
    ):
        self.directory = directory
        self.port = free_port()
        self.log_path = directory / "pgbouncer.log"
        (directory / "users.txt").write_text(f'"{user}" ""\n')
        config = directory / "pgbouncer.ini"
        config.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host=127.0.0.1 port={server_port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {directory / 'users.txt'}",
                    f"pool_mode = {pool_mode}",
                    f"default_pool_size = {pool_size}",
                    "max_client_conn = 200",
                    "ignore_startup_parameters = extra_float_digits",
                    "",
                ]
            )
        )
        command = [PGBOUNCER, str(config)]
        if os.geteuid() == 0:
            command[1:1] = ["-u", "postgres"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self._wait_until_listening()

    def _wait_until_listening(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited ({self.proc.returncode}):\n{self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer is not listening:\n{self.log()}") from None
                time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # immediate shutdown
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
