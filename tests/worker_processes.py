"""Real ``manage.py durable_worker`` processes for the worker tests.

Each process runs with the test settings against the database pytest created
(its name is passed in ``DURABLE_SUBPROCESS_DB_NAME``); its output goes to a file
the test can read while it runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval=0.05):
    """Return the first truthy value of ``predicate()``; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class WorkerProcess:
    def __init__(self, args: list[str], env: dict[str, str], log_path: Path):
        self.args = args
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "durable_worker", *args],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_output(self, text: str, timeout: float = 30) -> None:
        def seen():
            if self.proc.poll() is not None and text not in self.output():
                raise AssertionError(
                    f"worker exited ({self.proc.returncode}) before printing {text!r}:\n"
                    + self.output()
                )
            return text in self.output()

        wait_until(seen, timeout, f"{text!r} in the worker's output")

    def send(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker still running after {timeout}s:\n{self.output()}"
            ) from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


class WorkerPool:
    """Starts worker processes for one test and kills whatever is left at its end."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.started: list[WorkerProcess] = []

    def start(
        self, *args: str, extra_env: dict[str, str] | None = None, **settings: float | str
    ) -> WorkerProcess:
        """A worker with ``args``; ``settings`` become ``DURABLE_<NAME>`` variables,
        ``extra_env`` is added as is (e.g. libfaketime's, for this process only)."""
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DURABLE_SUBPROCESS_DB_NAME": str(connection.settings_dict["NAME"]),
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        for name, value in settings.items():
            env[f"DURABLE_{name.upper()}"] = str(value)
        env.update(extra_env or {})
        log_path = self.tmp_path / f"worker-{len(self.started)}.log"
        worker = WorkerProcess(list(args), env, log_path)
        self.started.append(worker)
        return worker

    def kill_all(self) -> None:
        for worker in self.started:
            worker.kill()


@pytest.fixture
def workers(tmp_path):
    """A WorkerPool for the test, every process it started killed at the end."""
    pool = WorkerPool(tmp_path)
    try:
        yield pool
    finally:
        pool.kill_all()
