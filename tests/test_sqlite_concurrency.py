"""The embedded default under light concurrency: the quickstart's project on SQLite,
served by ``runserver`` with a ``durable_worker`` process running, and 8 clients doing
5 keyed starts each over HTTP (issue 32, case 3).

With the SQLite options of quickstart step 2 (IMMEDIATE transactions, a busy timeout,
WAL) every start is answered; with ``startproject``'s database settings alone, starts
fail with HTTP 500 "database is locked", and ``check`` says what to add.

Both projects are built from the quickstart's own blocks (tests/quickstart_project.py),
against this checkout (the packaged wheel is tests/test_quickstart.py's business).
They make their own SQLite files, so they run whichever database the suite runs on.
"""

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests import quickstart_project as quickstart

pytestmark = [pytest.mark.slow]

CLIENTS = 8
STARTS = 5
ARTICLES = 10
CSRF = "a" * 32  # a CSRF secret the client sets itself, sent as cookie and header


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Project:
    def __init__(self, path: Path, database: str):
        self.path = path
        self.env = {**os.environ, "PYTHONPATH": str(quickstart.ROOT), "PYTHONUNBUFFERED": "1"}
        for name in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL"):
            self.env.pop(name, None)
        path.mkdir()
        quickstart.start_project(sys.executable, path, self.env)
        quickstart.write_files(path, database)
        self.manage("makemigrations", "articles")
        self.manage("migrate", "--noinput")
        self.manage(
            "shell",
            "-c",
            "from articles.models import Article\n"
            f"for i in range({ARTICLES}): Article.objects.create(title=str(i), body='text')",
        )
        self.processes: list[subprocess.Popen] = []
        self.logs: list = []

    def manage(self, *args: str) -> subprocess.CompletedProcess:
        return quickstart.run([sys.executable, "manage.py", *args], self.path, self.env)

    def spawn(self, *args: str) -> subprocess.Popen:
        log = open(self.path / f"{args[0]}.log", "w")  # noqa: SIM115 (closed in stop())
        self.logs.append(log)
        process = subprocess.Popen(
            [sys.executable, "manage.py", *args],
            cwd=self.path,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.processes.append(process)
        return process

    def serve(self) -> int:
        """A worker process and ``runserver``; the port once the server answers."""
        self.spawn("durable_worker")
        port = free_port()
        self.spawn("runserver", f"127.0.0.1:{port}", "--noreload")
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return port
            except OSError:
                assert time.monotonic() < deadline, (self.path / "runserver.log").read_text()
                time.sleep(0.2)

    def statuses(self) -> Counter:
        out = self.manage(
            "shell",
            "-c",
            "import json; from django_durable.models import Run; "
            "print(json.dumps(list(Run.objects.values_list('key', 'status'))))",
        ).stdout
        return Counter(status for _, status in json.loads(out.strip().splitlines()[-1]))

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in self.logs:
            log.close()


def publish(port: int, pk: int) -> tuple[int, str]:
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        client.request(
            "POST",
            f"/articles/{pk}/publish/",
            headers={"Cookie": f"csrftoken={CSRF}", "X-CSRFToken": CSRF},
        )
        response = client.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        client.close()


def traffic(port: int) -> list[tuple[int, str]]:
    """8 clients at once, 5 keyed starts each, over 10 articles (so keys repeat)."""
    answers: list[tuple[int, str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(CLIENTS)

    def client(number: int) -> None:
        barrier.wait()
        for i in range(STARTS):
            answer = publish(port, (number * STARTS + i) % ARTICLES + 1)
            with lock:
                answers.append(answer)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert len(answers) == CLIENTS * STARTS
    return answers


def locked(answers) -> int:
    return sum(1 for status, body in answers if status == 500 and "database is locked" in body)


def test_the_quickstart_settings_answer_every_keyed_start(tmp_path):
    project = Project(tmp_path / "recommended", "sqlite")
    assert "django_durable.W002" not in project.manage("check").stderr
    try:
        port = project.serve()
        answers = traffic(port)
        assert Counter(status for status, _ in answers) == {302: CLIENTS * STARTS}, [
            body[:300] for status, body in answers if status != 302
        ]
        # One run per article, whatever the duplicates; the worker runs them all.
        deadline = time.monotonic() + 180
        while (statuses := project.statuses()) != {"completed": ARTICLES}:
            assert sum(statuses.values()) == ARTICLES, statuses
            assert time.monotonic() < deadline, (
                statuses,
                (project.path / "durable_worker.log").read_text(),
            )
            time.sleep(1)
    finally:
        project.stop()


def test_startproject_settings_fail_with_database_is_locked_and_check_says_what_to_add(
    tmp_path,
):
    project = Project(tmp_path / "startproject", "startproject")
    check = project.manage("check").stderr
    assert "django_durable.W002" in check, check
    assert '"transaction_mode": "IMMEDIATE"' in check, check
    try:
        port = project.serve()
        # The failure depends on timing: a few rounds of the same traffic, until one
        # start is answered "database is locked" (it is, in the first round, here).
        for _ in range(5):
            answers = traffic(port)
            if locked(answers):
                break
        assert locked(answers) > 0, Counter(status for status, _ in answers)
    finally:
        project.stop()
