"""Live progress and streams (API §10): offsets, resets, close, limits, progress,
reading with ``after`` and ``timeout``, pruning; on PostgreSQL and SQLite."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

import django_durable as durable
from django_durable import step, store
from django_durable.models import Run, Status, Stream, StreamEntry
from django_durable.runtime.stream_writer import StreamWriter
from django_durable.store import streams
from django_durable.testing import drain
from tests.worker_processes import wait_until

pytestmark = pytest.mark.django_db

# What each database says of a unique constraint it enforced (SQLite names the columns).
UNIQUE = (
    {"once": "durable_stream_item_once", "one": "durable_stream_one_per_name"}
    if connection.vendor == "postgresql"
    else {
        "once": r"durable_stream_item\.run_id, durable_stream_item\.stream, "
        r"durable_stream_item\.offset",
        "one": r"durable_stream\.run_id, durable_stream\.name",
    }
)


def items(run_id, name="default", **kwargs):
    return list(durable.read_stream(run_id, name, timeout=0, **kwargs))


def writer(define, name="streams_tokens", **attrs):
    def generate(self, ctx):
        out = ctx.stream()
        for token in ctx.input.get("tokens", []):
            out.write(token)
        if ctx.input.get("close"):
            out.close()
        if ctx.input.get("after_close"):
            out.write("late")
        return "done"

    return define(name, generate=step(generate), **attrs)


def test_items_are_numbered_from_zero_in_the_order_written(define):
    run_id = durable.start(writer(define), {"tokens": ["a", {"b": [1, 2]}, None, 3.5]})
    drain()
    got = items(run_id)
    assert [i.offset for i in got] == [0, 1, 2, 3]
    assert [i.value for i in got] == ["a", {"b": [1, 2]}, None, 3.5]
    assert {i.kind for i in got} == {"value"}
    assert {i.step for i in got} == {"generate"}
    assert {i.attempt for i in got} == {1}
    assert all(i.written_at.tzinfo is not None for i in got)
    assert isinstance(got[0], durable.StreamItem)
    assert got[0]._fields == ("offset", "kind", "value", "step", "attempt", "written_at")


def test_after_skips_what_was_seen(define):
    run_id = durable.start(writer(define), {"tokens": list("abcde")})
    drain()
    assert [i.value for i in items(run_id, after=2)] == ["d", "e"]
    assert items(run_id, after=4) == []
    assert [i.offset for i in items(run_id, after=-1)] == [0, 1, 2, 3, 4]


def test_a_retry_begins_with_a_reset_item(define):
    def generate(self, ctx):
        out = ctx.stream("text")
        out.write(f"try {ctx.attempt}")
        if ctx.attempt == 1:
            raise RuntimeError("once")
        out.write("end")

    workflow = define("streams_retry", generate=step(generate, retries=2, backoff=0))
    run_id = durable.start(workflow)
    drain(run_timers=True)
    got = items(run_id, "text")
    assert [(i.offset, i.kind, i.value, i.attempt) for i in got] == [
        (0, "value", "try 1", 1),
        (1, "reset", None, 2),
        (2, "value", "try 2", 2),
        (3, "value", "end", 2),
    ]
    assert Run.objects.get(id=run_id).status == Status.COMPLETED


def test_no_reset_for_a_stream_the_earlier_attempt_did_not_write(define):
    def generate(self, ctx):
        if ctx.attempt == 1:
            ctx.stream("first").write(1)
            raise RuntimeError("once")
        ctx.stream("second").write(2)

    run_id = durable.start(define("streams_other", generate=step(generate, retries=1, backoff=0)))
    drain(run_timers=True)
    assert [i.kind for i in items(run_id, "second")] == ["value"]


def test_a_later_step_writing_the_same_stream_writes_no_reset(define):
    def one(self, ctx):
        ctx.stream().write("one")

    def two(self, ctx):
        ctx.stream().write("two")

    run_id = durable.start(define("streams_two_steps", one=step(one), two=step(two)))
    drain()
    assert [(i.kind, i.value, i.step) for i in items(run_id)] == [
        ("value", "one", "one"),
        ("value", "two", "two"),
    ]


def test_a_write_after_close_raises_stream_closed(define):
    caught = []

    def generate(self, ctx):
        out = ctx.stream()
        out.write(1)
        out.close()
        try:
            out.write(2)
        except durable.StreamClosed as exc:
            caught.append(exc)

    run_id = durable.start(define("streams_close", generate=step(generate)))
    drain()
    assert len(caught) == 1 and isinstance(caught[0], durable.DurableError)
    assert [i.value for i in items(run_id)] == [1]
    # A closed stream ends its readers even with no timeout.
    assert [i.value for i in durable.read_stream(run_id)] == [1]


def test_a_finished_runs_streams_end_and_a_stream_never_written_ends_at_once(define):
    run_id = durable.start(writer(define), {"tokens": [1, 2]})
    drain()
    assert [i.value for i in durable.read_stream(run_id)] == [1, 2]
    assert list(durable.read_stream(run_id, "never")) == []


def test_an_unknown_run_raises_does_not_exist():
    with pytest.raises(Run.DoesNotExist):
        durable.read_stream(uuid.uuid4())
    with pytest.raises(Run.DoesNotExist):
        durable.read_stream("not a uuid")


def test_a_stream_nobody_wrote_yet_yields_nothing_until_its_first_write(define):
    run_id = durable.start(writer(define), {"tokens": ["x"]})
    assert items(run_id) == []
    assert list(durable.read_stream(run_id, timeout=0.05)) == []
    drain()
    assert [i.value for i in items(run_id)] == ["x"]


@pytest.mark.parametrize(
    ("name", "error"),
    [
        (None, TypeError),
        (b"x", TypeError),
        ("", ValueError),
        ("x" * 101, ValueError),
        ("é" * 51, ValueError),
        ("a\x00", ValueError),
    ],
)
def test_bad_names_are_refused(define, name, error):
    caught = []

    def generate(self, ctx):
        try:
            ctx.stream(name)
        except Exception as exc:
            caught.append(exc)

    durable.start(define("streams_bad_name", generate=step(generate)))
    drain()
    assert len(caught) == 1 and isinstance(caught[0], error)
    with pytest.raises(error):
        durable.read_stream(uuid.uuid4(), name)
    assert Stream.objects.count() == 0


def test_a_name_of_100_bytes_is_fine(define):
    def generate(self, ctx):
        ctx.stream("é" * 50).write(1)

    run_id = durable.start(define("streams_long_name", generate=step(generate)))
    drain()
    assert [i.value for i in items(run_id, "é" * 50)] == [1]


@pytest.mark.parametrize(
    ("value", "error"),
    [({1, 2}, TypeError), (float("nan"), TypeError), (object(), TypeError), ("a\x00", ValueError)],
)
def test_values_that_are_not_json_are_refused_before_anything_is_written(define, value, error):
    caught = []

    def generate(self, ctx):
        try:
            ctx.stream().write(value)
        except Exception as exc:
            caught.append(exc)

    durable.start(define("streams_bad_value", generate=step(generate)))
    drain()
    assert len(caught) == 1 and isinstance(caught[0], error)
    assert StreamEntry.objects.count() == 0 and Stream.objects.count() == 0


def test_the_size_and_count_limits(define, settings):
    settings.DURABLE = {"MAX_STREAM_ITEM_BYTES": 10, "MAX_STREAM_ITEMS": 3}
    caught = []

    def generate(self, ctx):
        out = ctx.stream()
        try:
            out.write("x" * 20)
        except ValueError as exc:
            caught.append(str(exc))
        out.write("12345678")  # 10 bytes of JSON: at the limit
        out.write(1)
        out.write(2)
        try:
            out.write(3)
        except ValueError as exc:
            caught.append(str(exc))

    run_id = durable.start(define("streams_limits", generate=step(generate)))
    drain()
    assert "MAX_STREAM_ITEM_BYTES" in caught[0] and "MAX_STREAM_ITEMS" in caught[1]
    assert [i.value for i in items(run_id)] == ["12345678", 1, 2]
    assert Stream.objects.get(run_id=run_id).items == 3


def test_progress_is_kept_on_the_run_and_written_to_its_progress_stream(define):
    def generate(self, ctx):
        ctx.progress(1, 4, "starting")
        ctx.progress(2.5, None)
        ctx.progress(4, 4, "done")

    run_id = durable.start(define("streams_progress", generate=step(generate)))
    assert Run.objects.get(id=run_id).progress is None
    drain()
    progress = Run.objects.get(id=run_id).progress
    assert {k: progress[k] for k in ("done", "total", "message")} == {
        "done": 4,
        "total": 4,
        "message": "done",
    }
    assert "T" in progress["at"]
    got = items(run_id, "progress")
    assert [i.value["done"] for i in got] == [1, 2.5, 4]
    assert got[1].value["total"] is None and got[1].value["message"] is None
    assert durable.get_run(run_id).progress["done"] == 4


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("1",), TypeError),
        ((True,), TypeError),
        ((-1,), ValueError),
        ((1, -2), ValueError),
        ((1, "2"), TypeError),
        ((float("inf"),), ValueError),
        ((1, 2, 3), TypeError),
        ((1, 2, "x" * 1001), ValueError),
    ],
)
def test_bad_progress_is_refused(define, args, error):
    caught = []

    def generate(self, ctx):
        try:
            ctx.progress(*args)
        except Exception as exc:
            caught.append(exc)

    run_id = durable.start(define("streams_bad_progress", generate=step(generate)))
    drain()
    assert len(caught) == 1 and isinstance(caught[0], error)
    assert Run.objects.get(id=run_id).progress is None


def test_a_message_of_1000_characters_is_fine(define):
    def generate(self, ctx):
        ctx.progress(0, message="x" * 1000)

    run_id = durable.start(define("streams_long_message", generate=step(generate)))
    drain()
    assert len(Run.objects.get(id=run_id).progress["message"]) == 1000


def test_a_rerun_writes_to_the_new_runs_streams(define):
    run_id = durable.start(writer(define), {"tokens": ["a"]})
    drain()
    again = durable.rerun(run_id)
    drain()
    assert [i.value for i in items(again)] == ["a"]
    assert [i.value for i in items(run_id)] == ["a"]


def test_pruning_deletes_the_items_with_their_run(define):
    run_id = durable.start(writer(define), {"tokens": [1, 2, 3]})
    drain()
    kept = durable.start(writer(define, "streams_kept"), {"tokens": [1]})
    drain()
    Run.objects.filter(id=run_id).update(
        finished_at=Run.objects.get(id=run_id).finished_at - timedelta(days=60)
    )
    durable.prune(older_than=timedelta(days=30))
    assert not Run.objects.filter(id=run_id).exists()
    assert not StreamEntry.objects.filter(run_id=run_id).exists()
    assert not Stream.objects.filter(run_id=run_id).exists()
    assert StreamEntry.objects.filter(run_id=kept).count() == 1


def test_the_database_refuses_a_duplicate_offset(define):
    run_id = durable.start(writer(define), {"tokens": [1]})
    drain()
    entry = StreamEntry.objects.get(run_id=run_id)
    with pytest.raises(IntegrityError, match=UNIQUE["once"]), transaction.atomic():
        StreamEntry.objects.create(
            run_id=run_id, stream="default", offset=entry.offset, step="x", attempt=1
        )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_notices_thread_logs_a_lost_connection_and_notifies_the_next_write(define, caplog):
    """The notices thread's connection is terminated while it idles: the NOTIFY of the
    next write fails and is logged (its readers look again without it), and the one
    after it goes out on a new connection."""
    run = Run.objects.create(workflow="w", status="running", fence=1, attempt=1, input={})
    out = StreamWriter(run, "first", 0, "text")
    listener = store.open_listener(store.stream_channel())
    try:
        out.write("a")
        assert notified(listener, 1) == [f"{run.id}:text"]
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND query LIKE '%%pg_notify(%%unnest%%'"
            )
            assert cursor.fetchall() == [(True,)]
        with caplog.at_level(logging.WARNING, logger="django_durable.streams"):
            out.write("b")
            wait_until(lambda: caplog.records, 30, "the failed NOTIFY to be logged")
        assert "waking the readers of 1 stream(s) failed" in caplog.records[0].getMessage()
        out.write("c")
        assert notified(listener, 1) == [f"{run.id}:text"]
    finally:
        listener.close()
    assert [i.value for i in items(run.id, "text")] == ["a", "b", "c"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_readers_read_is_one_statement_with_the_streams_position():
    """What a woken reader reads (its items, and whether the stream ended with them) is
    one statement: the latency from a write to its readers holds one round trip."""
    run = Run.objects.create(workflow="w", status="running", fence=1, attempt=1, input={})
    StreamWriter(run, "first", 0, "text").write("a")
    StreamWriter(run, "first", 0, "text").close()
    with CaptureQueriesContext(connection) as captured:
        reader = durable.read_stream(run.id, "text", timeout=0)  # checks the run: 1 query
        assert [i.value for i in reader] == ["a"]  # every item, then ended: 1 query
    assert len(captured) == 2, [q["sql"] for q in captured]
    assert "durable_stream_item" in captured[1]["sql"]


def notified(listener, count: int) -> list[str]:
    """The next ``count`` payloads ``listener`` receives (30 s at most), then whatever
    else arrives within 0.3 s (none, when exactly ``count`` were sent)."""
    payloads = [n.payload for n in listener.notifies(timeout=30, stop_after=count)]
    return payloads + [n.payload for n in listener.notifies(timeout=0.3)]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_write_is_one_call_of_the_write_function_and_its_notify_goes_apart(define):
    """A write is one statement (a function whose statements each session plans once),
    committed alone; its NOTIFY goes from the process's notices thread, in a
    transaction of its own, so concurrent writers do not commit one by one behind the
    database-wide lock a NOTIFY holds until its transaction's WAL is flushed.
    durable_stream keeps half of each page free so that its rewrites stay HOT."""
    run = Run.objects.create(workflow="w", status="running", fence=1, attempt=1, input={})
    out = StreamWriter(run, "first", 0, "text")
    listener = store.open_listener(store.stream_channel())
    try:
        with CaptureQueriesContext(connection) as captured:
            for token in ["a", "b", "c"]:
                out.write(token)
        assert notified(listener, 1)[0] == f"{run.id}:text"
    finally:
        listener.close()
    statements = [q["sql"] for q in captured]
    assert len(statements) == 3
    assert all("durable_stream_write_v1(" in sql for sql in statements)
    assert [i.value for i in items(run.id, "text")] == ["a", "b", "c"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'durable_stream'")
        assert cursor.fetchone()[0] == ["fillfactor=50"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_writes_made_while_a_notify_is_sent_wake_their_readers_in_one_transaction(
    define, monkeypatch
):
    """The notices thread sends, in its next transaction, each stream written while it
    was sending, once: 6 writes to two streams while the first write's NOTIFY is held
    give 3 NOTIFYs, the first stream's, then each stream's once."""
    run = Run.objects.create(workflow="w", status="running", fence=1, attempt=1, input={})
    sending, go_on = threading.Event(), threading.Event()
    send, sent = streams.send_notices, []

    def held_once(payloads):
        sent.append(payloads)
        if not sending.is_set():
            sending.set()
            assert go_on.wait(30)
        send(payloads)

    monkeypatch.setattr(streams, "send_notices", held_once)
    listener = store.open_listener(store.stream_channel())
    try:
        StreamWriter(run, "first", 0, "a").write(0)
        assert sending.wait(30)
        for n in range(1, 4):
            StreamWriter(run, "first", 0, "a").write(n)
            StreamWriter(run, "first", 0, "b").write(n)
        go_on.set()
        assert notified(listener, 3) == [f"{run.id}:a", f"{run.id}:a", f"{run.id}:b"]
    finally:
        go_on.set()
        listener.close()
    assert sent == [[f"{run.id}:a"], [f"{run.id}:a", f"{run.id}:b"]]  # two statements
    assert [i.value for i in items(run.id, "a")] == [0, 1, 2, 3]


def test_the_database_refuses_a_bad_kind_and_a_second_stream_row(define):
    run_id = durable.start(writer(define), {"tokens": [1]})
    drain()
    kind = "durable_stream_item_kind_valid"
    with pytest.raises(IntegrityError, match=kind), transaction.atomic():
        StreamEntry.objects.create(
            run_id=run_id, stream="default", offset=9, kind="html", step="x", attempt=1
        )
    with pytest.raises(IntegrityError, match=UNIQUE["one"]), transaction.atomic():
        Stream.objects.create(run_id=run_id, name="default")
    with pytest.raises(IntegrityError, match="durable_stream_name_length"), transaction.atomic():
        Stream.objects.create(run_id=run_id, name="")


def test_timeout_must_be_a_number_and_after_an_offset(define):
    run_id = durable.start(writer(define))
    with pytest.raises(TypeError):
        durable.read_stream(run_id, timeout="1")
    with pytest.raises(ValueError):
        durable.read_stream(run_id, timeout=-1)
    with pytest.raises(TypeError):
        durable.read_stream(run_id, after="1")
    with pytest.raises(ValueError):
        durable.read_stream(run_id, after=-2)


def test_the_command_line_prints_one_json_line_per_item(define):
    run_id = durable.start(writer(define), {"tokens": ["a", {"b": 1}]})
    drain()
    out = StringIO()
    call_command("durable", "stream", str(run_id), stdout=out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(x["offset"], x["kind"], x["value"], x["step"]) for x in lines] == [
        (0, "value", "a", "generate"),
        (1, "value", {"b": 1}, "generate"),
    ]
    assert set(lines[0]) == {"offset", "kind", "value", "step", "attempt", "written_at"}
    out = StringIO()
    call_command("durable", "stream", str(run_id), "--after", "0", "--follow", stdout=out)
    assert len(out.getvalue().splitlines()) == 1
    missing = uuid.uuid4()
    with pytest.raises(CommandError, match=f"no run {missing}") as refused:
        call_command("durable", "stream", str(missing), stdout=StringIO())
    assert refused.value.returncode == 1


def test_the_sse_data_holds_no_markup_and_parses_to_the_same_value(define, client):
    """``<``, ``>`` and ``&`` go out as JSON escapes: htmx's ``sse-swap`` puts the data
    into the page as HTML, and it must find no tag there, only the JSON text."""
    value = {"text": "<img src=x onerror=alert(1)>", "also": "a & b </script>"}
    run_id = durable.start(writer(define, "streams_markup"), {"tokens": [value, "<b>"]})
    drain()
    response = client.get(f"/streams/{run_id}/default/")
    raw = b"".join(response.streaming_content)
    assert b"<" not in raw and b">" not in raw and b"&" not in raw
    data = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert [json.loads(d) for d in data if d] == [value, "<b>"]
    assert '"\\u003cimg src=x onerror=alert(1)\\u003e"' in data[0]


def test_a_wsgi_view_streams_events_and_ends_with_close(define, client):
    run_id = durable.start(writer(define), {"tokens": ["a", "b"]})
    drain()
    response = client.get(f"/streams/{run_id}/default/", HTTP_LAST_EVENT_ID="0")
    assert response["Content-Type"].startswith("text/event-stream")
    body = b"".join(response.streaming_content).decode()
    assert 'id: 1\nevent: value\ndata: "b"\n\n' in body
    assert "id: 0\n" not in body
    assert body.endswith("event: close\ndata: \n\n")


@pytest.mark.django_db(transaction=True)
def test_async_readers_of_a_stream_written_fast_get_each_item_once_in_order(define):
    """Many async readers on one event loop, started at different offsets while a thread
    writes as fast as it can: rung readers share the reads begun at each ring, and a
    ring that comes while a reader is still yielding an earlier answer must not hand it
    an answer for an offset it has passed (each item exactly once, in order)."""
    import asyncio
    import threading

    from asgiref.sync import sync_to_async
    from django.db import connections

    run = Run.objects.create(workflow="w", status="running", fence=1, attempt=1, input={})
    total = 60
    started = threading.Event()

    def write_all() -> None:
        try:
            out = StreamWriter(run, "first", 0, "fast")
            out.write(0)
            started.set()
            for value in range(1, total):
                out.write(value)
            out.close()
        finally:
            connections.close_all()

    async def reader(after):
        seen = []
        async for item in durable.aread_stream(run.id, "fast", after=after, timeout=30):
            seen.append(item.offset)
        return after, seen

    async def main():
        thread = threading.Thread(target=write_all)
        thread.start()
        await sync_to_async(started.wait, thread_sensitive=False)(30)
        tasks = [asyncio.create_task(reader(None)) for _ in range(20)]
        tasks += [asyncio.create_task(reader(k % 5)) for k in range(20)]
        results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        await sync_to_async(thread.join, thread_sensitive=False)(30)
        return results

    try:
        results = asyncio.run(main())
    finally:
        # The read threads keep their connections: close them (each thread runs one).
        from django_durable.runtime import stream_reader

        barrier = threading.Barrier(stream_reader.READ_THREADS)

        def close() -> None:
            barrier.wait(30)
            connections.close_all()

        for done in [stream_reader._reads.submit(close) for _ in range(barrier.parties)]:
            done.result(60)
    for after, seen in results:
        first = 0 if after is None else after + 1
        assert seen == list(range(first, total)), (after, seen)
