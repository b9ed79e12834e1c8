"""Streams after failures, with real worker processes and a real ASGI server: a worker
killed mid-step while it writes, transactions that roll back around writes. A reader
resuming with ``Last-Event-ID`` sees every committed item once, in order, with the
``reset`` item where an attempt started over; nothing an aborted transaction wrote
shows. (A PostgreSQL restart while readers wait: tests/test_stream_restart.py.)"""

from __future__ import annotations

import threading
import uuid

import httpx
import pytest
from django.db import connection, transaction

import django_durable as durable
from django_durable import step
from django_durable.models import Run, Status, StreamEntry
from django_durable.testing import drain
from tests.test_stream_server import Server, read_events
from tests.testapp.models import Execution
from tests.worker_processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SHORT_LEASE = {"lease_seconds": 2, "heartbeat_seconds": 0.4, "poll_seconds": 0.2}
ITEMS = 12


def committed(run_id, name="text") -> list[tuple]:
    """What the database holds of the stream: (offset, kind, value, attempt), in order."""
    rows = StreamEntry.objects.filter(run_id=run_id, stream=name).order_by("offset")
    return list(rows.values_list("offset", "kind", "value", "attempt"))


def read_until_close(client, url, headers, out: list, timeout=90) -> None:
    """Read events into ``out`` until ``event: close``."""
    got, _ = read_events(client, url, 10_000, headers, timeout=timeout)  # ends at close
    out.extend(got)


def test_a_worker_killed_mid_step_then_retried_loses_and_repeats_nothing(tmp_path, workers):
    run_id = durable.start("streams_slowly", {"items": ITEMS, "pause": 0.25})
    first = workers.start("--concurrency", "1", **SHORT_LEASE)
    web = Server(tmp_path)
    try:
        with httpx.Client() as client:
            # A browser sees the first items, then its connection drops.
            before, _ = read_events(client, web.url(run_id, "text"), 3)
            wait_until(lambda: len(committed(run_id)) >= 5, 60, "5 items written")
            first.kill()  # SIGKILL: mid-step, between two writes
            at_kill = committed(run_id)
            assert len(at_kill) < ITEMS, "the step finished before the kill"
            # It reconnects with the last id it saw while nobody runs the step (the
            # lease has not expired yet), and reads until the stream is closed.
            after: list[dict] = []
            resumed = threading.Thread(
                target=read_until_close,
                args=(client, web.url(run_id, "text"), {"Last-Event-ID": before[-1]["id"]}, after),
                daemon=True,
            )
            resumed.start()
            workers.start("--concurrency", "1", **SHORT_LEASE)  # it recovers the run
            resumed.join(90)
            assert not resumed.is_alive(), "the resumed reader never saw the stream close"
        run = wait_until(
            lambda: Run.objects.filter(id=run_id, status=Status.COMPLETED).first(), 60, "done"
        )
    finally:
        web.stop()
    assert run.recoveries == 1
    assert Execution.objects.filter(run_id=run_id).count() == 2
    stored = committed(run_id)
    killed_at = len(at_kill)
    # In the database: the killed attempt's items, one reset, the retry's items.
    assert [(kind, value) for _, kind, value, _ in stored] == (
        [("value", f"tok-{i}") for i in range(killed_at)]
        + [("reset", None)]
        + [("value", f"tok-{i}") for i in range(ITEMS)]
    )
    assert [offset for offset, *_ in stored] == list(range(killed_at + 1 + ITEMS))
    assert {attempt for *_, attempt in stored[killed_at:]} == {stored[killed_at][3]}
    # What the reader saw, across its reconnect: each committed item once, in order,
    # then close.
    seen = before + after
    assert seen[-1] == {"event": "close", "data": ""}
    assert [(int(e["id"]), e["event"]) for e in seen[:-1]] == [
        (offset, kind) for offset, kind, *_ in stored
    ]
    print(f"\nkilled after {killed_at} items; the reader saw {len(seen) - 1} items and close")


@pytest.mark.postgres  # SQLite: a write waits for the step's own open transaction
def test_a_write_in_the_steps_own_transaction_is_committed_at_once_as_documented(workers):
    """docs/streams.md: a write is committed on its own, not with a transaction the
    step opened: it stays when that transaction rolls back (a reader may have shown it)."""
    run_id = durable.start("writes_inside_its_transaction")
    worker = workers.start("--concurrency", "1", **SHORT_LEASE)
    wait_until(lambda: Run.objects.filter(id=run_id, status=Status.COMPLETED).exists(), 60, "done")
    worker.kill()
    assert [(i.kind, i.value) for i in durable.read_stream(run_id, "text")] == [
        ("value", "kept"),
        ("value", "after"),
    ]
    # The rest of the rolled-back transaction is gone.
    assert not Execution.objects.filter(run_id=run_id).exists()


def test_nothing_a_rolled_back_transaction_wrote_is_ever_shown(define):
    """A transaction open before the step began (a test's, around drain()) holds the
    step's writes: a reader meanwhile sees none, and after the rollback there are none."""
    gate = threading.Event()

    def generate(self, ctx):
        out = ctx.stream()
        for i in range(5):
            out.write(i)
        ctx.progress(5, 5)
        gate.set()
        assert seen_by_reader.wait(30)

    workflow = define("streams_rolled_back", generate=step(generate))
    run_id = durable.start(workflow)
    seen: list = []
    seen_by_reader = threading.Event()

    def reader():
        try:
            assert gate.wait(30)
            # While the writes are uncommitted: a reader on another connection waits.
            seen.extend(durable.read_stream(run_id, timeout=1))
            seen.extend(durable.read_stream(run_id, "progress", timeout=0))
        finally:
            seen_by_reader.set()
            connection.close()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    with pytest.raises(RuntimeError, match="roll back"), transaction.atomic():
        drain()
        raise RuntimeError("roll back")
    thread.join(30)
    assert seen == []
    assert list(durable.read_stream(run_id, timeout=0)) == []
    assert list(durable.read_stream(run_id, "progress", timeout=0)) == []
    assert Run.objects.get(id=run_id).progress is None
    # The run is as it was: when it runs again, its writes start from offset 0 (no reset:
    # no earlier attempt wrote anything that stayed).
    gate.clear()
    seen_by_reader.set()
    drain()
    assert [(i.offset, i.kind, i.value) for i in durable.read_stream(run_id, timeout=0)] == [
        (n, "value", n) for n in range(5)
    ]


@pytest.mark.postgres
def test_writes_inside_steps_transactions_leave_no_connection_open(workers):
    """Each such write goes through a second connection of the worker's thread: it is
    closed when the step ends, so many steps later the worker holds what it held."""
    name = f"durable-streams-{uuid.uuid4().hex[:8]}"
    worker = workers.start(
        "--concurrency", "4", extra_env={"DURABLE_TEST_APPLICATION_NAME": name}, **SHORT_LEASE
    )

    def sessions() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name]
            )
            return cursor.fetchone()[0]

    def all_done(run_ids) -> bool:
        return Run.objects.filter(id__in=run_ids, status=Status.COMPLETED).count() == len(run_ids)

    # Streams written outside any transaction of the step: the worker's usual sessions.
    plain = [durable.start("streams_slowly", {"items": 3}) for _ in range(20)]
    wait_until(lambda: all_done(plain), 60, "the plain runs")
    before = sessions()
    inside = [durable.start("writes_inside_its_transaction") for _ in range(40)]
    wait_until(lambda: all_done(inside), 90, "the runs writing inside their transactions")
    # A closed session leaves pg_stat_activity a moment after its close. A thread the
    # plain runs left unused may open its own session now (one more); a side session
    # left open would be one per thread that wrote inside a transaction (4 here: 8
    # became 13 before the fix).
    most = before + 1
    after = wait_until(
        lambda: (n := sessions()) <= most and n, 10, f"at most {most} sessions", interval=0.2
    )
    worker.kill()
    print(f"\nworker sessions: {before} before, {after} after 40 steps writing in transactions")
