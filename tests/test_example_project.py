"""The demo's pieces work: the example project migrates, its traffic produces every
kind of re-add, and a worker runs the workflows; ``scripts/demo.sh`` refuses a busy
DEMO_PORT before it starts anything, prints its banner after the worker's start-up
lines, and trips no warning of django-durable's."""

import json
import os
import queue
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def manage(tmp_path, *args, timeout=120):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "SQLITE_PATH": str(tmp_path / "demo.sqlite3"),
    }
    env.pop("DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )


@pytest.mark.slow
def test_traffic_shows_every_key_feature_and_a_worker_runs_it(tmp_path):
    manage(tmp_path, "migrate", "--noinput", "-v", "0")
    out = manage(tmp_path, "durable_traffic", "--seed", "1").stdout
    for outcome in ("started", "use_existing", "KeyTaken", "run_again", "debounced"):
        assert outcome in out, out
    manage(tmp_path, "durable_worker", "--burst", "--concurrency", "4", timeout=300)
    # --burst stops when nothing is due now: a retry backoff or a debounce period
    # may still be pending, but nothing is left running.
    counts = manage(
        tmp_path,
        "shell",
        "-c",
        (
            "import json; from collections import Counter; from django_durable.models import Run; "
            "print(json.dumps(Counter(Run.objects.values_list('status', flat=True))))"
        ),
    ).stdout
    statuses = json.loads(counts.strip().splitlines()[-1])
    assert statuses.get("completed", 0) >= 10 and "running" not in statuses, counts
    # The summaries streamed their words and progress (the dashboard shows them).
    streamed = manage(
        tmp_path,
        "shell",
        "-c",
        (
            "import json, django_durable as durable; from django_durable.models import Run\n"
            "runs = Run.objects.filter(workflow='summarize_document')\n"
            "print(json.dumps([[r.status, r.progress,\n"
            "    [i.value for i in durable.read_stream(r.id, 'text', timeout=0)]] for r in runs]))"
        ),
    ).stdout
    summaries = json.loads(streamed.strip().splitlines()[-1])
    assert len(summaries) == 2, streamed
    for status, progress, words in summaries:
        assert status == "completed" and len(words) > 10 and words[0] == "Durable ", streamed
        assert progress["done"] == progress["total"] == len(words), progress


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def demo_environment(tmp_path, port: int) -> dict:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "DEMO_PORT": str(port),
        "SQLITE_PATH": str(tmp_path / "demo.sqlite3"),
        "DEMO_LOGS": str(tmp_path / "logs"),
    }
    for name in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE"):
        env.pop(name, None)
    return env


def test_the_example_project_has_no_warning_of_ours(tmp_path):
    """The demo's settings are the recommended ones: no django_durable warning, and
    none from a worker started the way the demo starts it."""
    out = manage(tmp_path, "check")
    assert "django_durable" not in out.stdout + out.stderr
    manage(tmp_path, "migrate", "--noinput", "-v", "0")
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    [line] = [line for line in demo.splitlines() if "manage.py durable_worker" in line]
    args = shlex.split(line.split("manage.py", 1)[1])
    worker = manage(tmp_path, *args, "--burst")
    assert "django_durable.W" not in worker.stdout + worker.stderr


@pytest.mark.parametrize("only_the_check", [False, True])
def test_the_demo_refuses_a_busy_port_before_anything_starts(tmp_path, only_the_check):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = subprocess.run(
            ["bash", "scripts/demo.sh", *(["--check-port"] if only_the_check else [])],
            cwd=ROOT,
            env=demo_environment(tmp_path, port),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode != 0
    assert f"port {port}" in result.stderr and "DEMO_PORT=" in result.stderr, result.stderr
    assert result.stdout == ""
    # Nothing started: no database, no logs.
    assert list(tmp_path.iterdir()) == []


class Lines:
    """A process's output read line by line on a thread, so that every read has a
    deadline: a demo that hangs fails the test instead of blocking it."""

    def __init__(self, stream):
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream):
        for line in stream:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)  # the end of the output

    def until(self, text: str, timeout: float) -> list[str]:
        """The lines up to the first holding ``text``; fail after ``timeout`` seconds."""
        deadline, seen = time.monotonic() + timeout, []
        while True:
            line = self.next(deadline, f"{text!r}", seen)
            assert line is not None, f"output ended before {text!r}:\n" + "\n".join(seen)
            seen.append(line)
            if text in line:
                return seen

    def rest(self, timeout: float) -> list[str]:
        """Every line up to the end of the output; fail after ``timeout`` seconds."""
        deadline, seen = time.monotonic() + timeout, []
        while (line := self.next(deadline, "the end of the output", seen)) is not None:
            seen.append(line)
        return seen

    def next(self, deadline: float, what: str, seen: list[str]) -> str | None:
        try:
            return self.lines.get(timeout=max(deadline - time.monotonic(), 0))
        except queue.Empty:
            raise AssertionError(f"no {what} in time; so far:\n" + "\n".join(seen)) from None


# Run as the demo's own process: SIGINT back to its default first. A process started
# in the background by a shell without job control inherits SIGINT ignored, and bash
# can neither trap nor reset a signal ignored when it starts: the demo would never
# see Ctrl-C. (Not preexec_fn: it is unsafe while threads run.)
WITH_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


@pytest.mark.slow
def test_the_demo_prints_its_banner_last_and_stops_on_ctrl_c(tmp_path):
    port = free_port()
    env = demo_environment(tmp_path, port)
    demo = subprocess.Popen(
        [sys.executable, "-c", WITH_SIGINT, "bash", "scripts/demo.sh"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Its own process group, as a terminal's foreground job is: Ctrl-C is SIGINT
        # to the group, and a failing test can stop all the demo started.
        start_new_session=True,
    )
    try:
        output = Lines(demo.stdout)
        lines = output.until("Press Ctrl-C to stop.", timeout=180)
        text = "\n".join(lines)
        assert f"Dashboard: http://127.0.0.1:{port}/admin/durable/" in text, text
        banner = next(i for i, line in enumerate(lines) if "django-durable demo" in line)
        started = [i for i, line in enumerate(lines) if line.startswith("worker ")]
        assert started and max(started) < banner, text
        assert "django_durable.W" not in text
        # The worker works meanwhile (its lines go to its log, not over the banner).
        log = tmp_path / "logs" / "worker.log"
        deadline = time.monotonic() + 120
        while " completed " not in log.read_text():
            assert demo.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C
        rest = output.rest(timeout=90)
        try:
            code = demo.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError("the demo did not stop on Ctrl-C (SIGINT ignored?)") from None
        assert code == 0, "\n".join(rest)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(timeout=30)
        demo.stdout.close()
    # After the banner, nothing until Ctrl-C: then the demo says it stops.
    assert "\n".join(rest).strip() == (
        "demo: stopping the worker, the traffic and the web server..."
    ), rest
    logs = "".join(p.read_text() for p in (tmp_path / "logs").iterdir())
    assert "django_durable.W" not in logs
    assert "System check identified no issues" in logs


def test_git_ignores_the_demo_database_and_what_sqlite_leaves_beside_it():
    """``make demo`` stopped with Ctrl-C may leave SQLite's write-ahead log and its
    shared-memory file beside the database: none of them shows as untracked."""
    names = ["demo.sqlite3", "demo.sqlite3-wal", "demo.sqlite3-shm", "demo.sqlite3-journal"]
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode == 128:
        pytest.skip(f"not a git work tree: {done.stderr.strip()}")
    assert sorted(done.stdout.split()) == sorted(names), done.stdout + done.stderr
