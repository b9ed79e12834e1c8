"""PostgreSQL stopped for a while (a cluster of the test's own, tests/own_cluster.py)
while stream readers wait, then restarted while a step writes: a ``durable stream
--follow`` process (a sync reader) and an SSE client of a uvicorn process (async
readers; it reconnects with ``Last-Event-ID`` as a browser's EventSource does) each
end with every committed item once, in order. Their LISTEN connections come back."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import httpx
import pytest

from django_durable.runtime.stream_listener import RECHECK
from tests import own_cluster
from tests.test_stream_server import Server, events
from tests.worker_processes import ROOT, WorkerProcess, wait_until

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not own_cluster.available(), reason="pg_createcluster is not installed"),
]

ITEMS = 40
LISTENING = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %%_streams%%'"
WRITTEN = "SELECT count(*) FROM durable_stream_item WHERE stream = 'text' AND kind = 'value'"
STATUS = "SELECT status FROM durable_run"
DUMP = """
import django, json
django.setup()
from django_durable.models import StreamEntry
rows = StreamEntry.objects.filter(stream="text").order_by("offset")
print(json.dumps([[o, k, v] for o, k, v in rows.values_list("offset", "kind", "value")]))
"""
START = """
import django
django.setup()
import django_durable as durable
print(durable.start("streams_slowly", {"items": %d, "pause": 0.15}))
"""


@pytest.fixture
def cluster():
    with own_cluster.own_cluster("streams") as pg:
        yield pg


class EventSource(threading.Thread):
    """What a browser's EventSource does: reconnect after an error with the last id
    seen, until ``event: close``."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.seen, self.reconnects = url, [], 0
        self.connected = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + 180
        with httpx.Client() as client:
            while time.monotonic() < deadline:
                headers = {"Last-Event-ID": self.seen[-1]["id"]} if self.seen else {}
                try:
                    with client.stream("GET", self.url, headers=headers, timeout=60) as response:
                        pending = []
                        for line in response.iter_lines():
                            self.connected.set()
                            pending.append(line)
                            if line != "":
                                continue
                            for event in events(pending):
                                if "comment" not in event:
                                    self.seen.append(event)
                            pending = []
                            if self.seen and self.seen[-1].get("event") == "close":
                                return
                except httpx.HTTPError:
                    pass
                self.reconnects += 1
                time.sleep(0.2)


def test_readers_miss_nothing_across_an_outage_and_a_restart(cluster, tmp_path):
    run_id = cluster.python("-c", START % ITEMS).strip().splitlines()[-1]
    timing = {"DURABLE_POLL_SECONDS": "0.3"}
    with open(tmp_path / "follow.out", "wb") as out, open(tmp_path / "follow.err", "wb") as err:
        follower = subprocess.Popen(
            [sys.executable, "manage.py", "durable", "stream", run_id, "--name=text", "--follow"],
            cwd=ROOT,
            env=cluster.env(**timing),
            stdout=out,
            stderr=err,
        )
    web = Server(
        tmp_path,
        DURABLE_TEST_DB="postgres",
        DURABLE_SUBPROCESS_DB_NAME=cluster.database,
        DURABLE_TEST_PORT=str(cluster.port),
        **timing,
    )
    browser = EventSource(web.url(run_id, "text"))
    worker = None
    try:
        browser.start()
        assert browser.connected.wait(30)
        # Both readers wait on their process's LISTEN (nobody wrote yet).
        wait_until(lambda: cluster.scalar(LISTENING) == 2, 30, "the two listeners")
        # Down while they wait, longer than a waiting reader goes without a look
        # (RECHECK): each reads while the database is out of reach, and reads again.
        cluster.ctl("stop")
        time.sleep(RECHECK + 1)
        cluster.ctl("start")
        wait_until(lambda: cluster.scalar(LISTENING) == 2, 60, "the listeners to reconnect")
        worker = WorkerProcess(
            ["--concurrency", "2"],
            cluster.env(DURABLE_LEASE_SECONDS="5", DURABLE_HEARTBEAT_SECONDS="1", **timing),
            tmp_path / "worker.log",
        )
        wait_until(lambda: (cluster.scalar(WRITTEN) or 0) >= ITEMS // 3, 60, "items written")
        cluster.restart()  # while the step writes
        wait_until(lambda: cluster.scalar(STATUS) == "completed", 120, "the run to complete")
        assert follower.wait(60) == 0, (tmp_path / "follow.err").read_text()
        browser.join(60)
        assert not browser.is_alive(), f"the browser never saw close: {browser.seen[-3:]}"
        stored = json.loads(cluster.python("-c", DUMP).strip().splitlines()[-1])
    finally:
        if follower.poll() is None:
            follower.kill()
        if worker is not None:
            worker.kill()
        web.stop()
    assert stored[-1][1] == "value" and len(stored) >= ITEMS
    followed = [json.loads(line) for line in (tmp_path / "follow.out").read_text().splitlines()]
    assert [[item["offset"], item["kind"], item["value"]] for item in followed] == stored
    assert browser.seen[-1] == {"event": "close", "data": ""}
    assert [[int(e["id"]), e["event"], json.loads(e["data"])] for e in browser.seen[:-1]] == stored
    print(
        f"\n{len(stored)} items ({sum(k == 'reset' for _, k, _ in stored)} resets); the "
        f"browser reconnected {browser.reconnects} times"
    )
