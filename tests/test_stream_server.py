"""``stream_response`` under a real ASGI server (uvicorn, in its own process), read by a
real HTTP client (httpx): events as they are written, ``Last-Event-ID`` resumes,
heartbeats, ``event: close``; and many idle clients on one process hold a couple of
database connections, not one each."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from django.db import connection

import django_durable as durable
from django_durable import step
from django_durable.testing import drain
from tests.worker_processes import ROOT, wait_until

pytestmark = [pytest.mark.django_db(transaction=True)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """uvicorn serving tests.asgi with the test database, killed at the end."""

    def __init__(self, tmp_path: Path, **env: str):
        self.port = free_port()
        self.app_name = f"durable-sse-{uuid.uuid4().hex[:8]}"
        self.log = tmp_path / "uvicorn.log"
        environment = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DURABLE_SUBPROCESS_DB_NAME": str(connection.settings_dict["NAME"]),
            "DURABLE_APPLICATION_NAME": self.app_name,
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "tests.asgi:application",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--log-level",
                    "warning",
                    "--no-access-log",
                    "--timeout-keep-alive",
                    "60",
                ],
                cwd=ROOT,
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until(self._accepts, 30, "uvicorn to accept connections")

    def _accepts(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"uvicorn exited:\n{self.log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True

    def url(self, run_id, name="default", view="astreams") -> str:
        return f"http://127.0.0.1:{self.port}/{view}/{run_id}/{name}/"

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def sessions(self) -> int:
        """The database sessions this process holds."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                [self.app_name],
            )
            return cursor.fetchone()[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if connection.vendor == "postgresql":  # its sessions end a moment later
            wait_until(lambda: self.sessions() == 0, 10, "the server's sessions to end")


def sessions_then_close(web: Server) -> int:
    """``web.sessions()`` from a thread of its own, which closes its connection after."""
    try:
        return web.sessions()
    finally:
        connection.close()


@pytest.fixture
def server(tmp_path):
    started = []

    def start(**env):
        started.append(Server(tmp_path, **env))
        return started[-1]

    yield start
    for one in started:
        one.stop()


def draining(seconds: float) -> threading.Thread:
    """``drain()`` in a thread of its own, which closes its connection when done."""

    def run():
        try:
            drain(max_seconds=seconds)
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def gated_writer(define, gates: list[threading.Event], name="sse_gated"):
    """A workflow whose step writes item i once gates[i] is set, then closes."""

    def generate(self, ctx):
        out = ctx.stream()
        for i, gate in enumerate(gates):
            assert gate.wait(60), "the test never opened the gate"
            out.write({"token": i, "html": "<b>not html</b>"})
        out.close()

    return define(name, generate=step(generate))


def events(lines) -> list[dict]:
    """Parse SSE lines into events (comments as {"comment": ...})."""
    found, current = [], {}
    for line in lines:
        if line.startswith(":"):
            found.append({"comment": line[1:].strip()})
        elif line == "":
            if current:
                found.append(current)
            current = {}
        else:
            field, _, value = line.partition(":")
            current[field] = value[1:] if value.startswith(" ") else value
    return found


def read_events(client: httpx.Client, url: str, count: int, headers=None, timeout=30):
    """Open the stream, read ``count`` events (comments not counted), return them and
    the response's headers; the connection is closed after."""
    got, pending = [], []
    deadline = time.monotonic() + timeout
    with client.stream("GET", url, headers=headers or {}, timeout=timeout) as response:
        if response.status_code != 200:
            raise AssertionError(f"{response.status_code}: {response.read()[:3000]!r}")
        for line in response.iter_lines():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out reading {url}: {got}")
            pending.append(line)
            if line == "":
                got.extend(e for e in events(pending) if "comment" not in e)
                pending = []
                if len(got) >= count:
                    break
        return got, response.headers


@pytest.mark.parametrize("view", ["astreams", "streams"])
def test_events_arrive_as_written_and_a_reconnect_resumes_after_last_event_id(define, server, view):
    gates = [threading.Event() for _ in range(5)]
    run_id = durable.start(gated_writer(define, gates, f"sse_{view}"))
    drainer = draining(60)
    web = server()
    with httpx.Client() as client:
        for gate in gates[:3]:
            gate.set()
        got, headers = read_events(client, web.url(run_id, view=view), 3)
        assert headers["content-type"].startswith("text/event-stream")
        assert "no-cache" in headers["cache-control"]
        assert headers["x-accel-buffering"] == "no"
        assert [(e["id"], e["event"]) for e in got] == [
            ("0", "value"),
            ("1", "value"),
            ("2", "value"),
        ]
        # JSON text, never HTML: the value is one line of JSON, its markup a string.
        assert "\n" not in got[0]["data"]
        assert json.loads(got[0]["data"]) == {"token": 0, "html": "<b>not html</b>"}
        # ... and with no markup for a page that swaps it in as HTML to find.
        assert not set("<>&") & set(got[0]["data"])
        assert "\\u003cb\\u003e" in got[0]["data"]
        for gate in gates[3:]:
            gate.set()
        again, _ = read_events(client, web.url(run_id, view=view), 3, {"Last-Event-ID": "2"})
        assert [(e.get("id"), e.get("event")) for e in again] == [
            ("3", "value"),
            ("4", "value"),
            (None, "close"),
        ]
    drainer.join(30)


def test_an_idle_stream_sends_heartbeats_and_a_finished_run_closes_at_once(define, server):
    gates = [threading.Event()]
    run_id = durable.start(gated_writer(define, gates, "sse_idle"))
    drainer = draining(60)
    web = server(DURABLE_STREAM_HEARTBEAT_SECONDS="0.3")
    comments = 0
    with httpx.Client() as client, client.stream("GET", web.url(run_id), timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith(":"):
                comments += 1
                if comments == 3:
                    break
    gates[0].set()
    drainer.join(30)
    with httpx.Client() as client:
        got, _ = read_events(client, web.url(run_id, "never-written"), 1)
    assert got == [{"event": "close", "data": ""}]


@pytest.mark.postgres
def test_many_idle_clients_hold_a_couple_of_connections(define, server):
    clients = int(os.environ.get("DURABLE_SSE_CLIENTS", "200"))
    gates = [threading.Event()]
    run_id = durable.start(gated_writer(define, gates, "sse_many"))
    drainer = draining(120)
    web = server()
    before = web.rss_kib()
    received: list[float] = []
    connected = 0

    async def reader(client: httpx.AsyncClient):
        nonlocal connected
        async with client.stream("GET", web.url(run_id), timeout=120) as response:
            pending = []
            async for line in response.aiter_lines():
                if line.startswith(":"):
                    connected += 1
                    continue
                pending.append(line)
                if line == "" and any(p.startswith("event: value") for p in pending):
                    received.append(time.monotonic())
                    return

    async def main():
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(limits=limits, timeout=120) as client:
            tasks = [asyncio.create_task(reader(client)) for _ in range(clients)]
            deadline = time.monotonic() + 120
            while connected < clients:
                assert time.monotonic() < deadline, f"{connected} of {clients} connected"
                await asyncio.sleep(0.1)
            await asyncio.sleep(1)  # every reader now waits
            held = await asyncio.to_thread(sessions_then_close, web)
            rss = web.rss_kib()
            written = time.monotonic()
            gates[0].set()
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
            return held, rss, written

    held, rss, written = asyncio.run(main())
    latencies = sorted(at - written for at in received)
    print(
        f"\n{clients} idle SSE clients: {held} database sessions, "
        f"{(rss - before) / clients:.1f} KiB each, write->reader p50 "
        f"{latencies[len(latencies) // 2] * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms"
    )
    assert len(received) == clients
    # The listener's connection, the read threads' (READ_THREADS), nothing per client.
    assert held <= 3
    drainer.join(30)


def test_a_failing_read_is_reported_as_itself_not_as_a_sync_iterator(define, server):
    """A TypeError inside the async body (here sqlite3.connect() refusing a connection
    option; PostgreSQL refuses it with its own error) must reach the log as itself:
    Django would take it for "not an async iterator" and iterate the body again."""
    gates = [threading.Event()]
    run_id = durable.start(gated_writer(define, gates, "sse_broken"))
    web = server(DURABLE_TEST_DB_OPTIONS=json.dumps({"no_such_option": 1}))
    with httpx.Client() as client, pytest.raises(httpx.RemoteProtocolError):
        read_events(client, web.url(run_id), 1, timeout=20)
    log = web.log.read_text()
    assert "no_such_option" in log
    assert "object is not iterable" not in log
    assert "must consume synchronous iterators" not in log
