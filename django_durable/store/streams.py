"""Streams' statements: a write (one statement, committed alone; its NOTIFY goes
after it from the process's notices thread), a close, the reads.

A write is durable when it returns, whatever transaction the step has open: it runs
on this thread's connection when that one is in autocommit (the worker's case), and
otherwise on a second connection of the thread's own (``side_connection``), so a
write made inside the step's ``transaction.atomic()`` is committed at once and is not
undone with that transaction; that one is closed when the step ends. The store writes
what it is told; which stream, which value and whether the writer may write are
decided in ``operations.streams``.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import Error, connections
from django.db.models import OuterRef, Subquery

from django_durable import conf
from django_durable.models import FINISHED_STATUSES, Run, Stream, StreamEntry
from django_durable.store.base import alias, atomic, db, engine, fetchall, fetchone, now

__all__ = [
    "StreamPosition",
    "StreamWrite",
    "close_stream",
    "latest_stream_items",
    "latest_values",
    "notify_streams",
    "read_stream",
    "read_stream_items",
    "release_side_connection",
    "run_streams",
    "stream_channel",
    "stream_payload",
    "stream_position",
    "stream_refusal",
    "stop_stream_notices",
    "write_stream",
]

# The columns a reader gets of an item, in ``StreamItem``'s order.
ITEM_COLUMNS = ("offset", "kind", "value", "step", "attempt", "written_at")
# How long the notices thread waits for another write before it closes its connection
# and ends (the next write starts it again).
NOTICES_IDLE = 10.0

logger = logging.getLogger("django_durable.streams")
_local = threading.local()


def stream_channel() -> str:
    """The NOTIFY channel of stream writes (beside the workers' ``NOTIFY_CHANNEL``, so a
    write wakes no worker and doctor's count of listening workers stays theirs)."""
    return f"{conf.get('NOTIFY_CHANNEL')}_streams"


def stream_payload(run_id: uuid.UUID, name: str) -> str:
    """What a write's NOTIFY says: the run and the stream (a run id has no ``:``)."""
    return f"{run_id}:{name}"


def notify_streams(payload: str) -> None:
    """NOTIFY ``payload`` on the streams' channel (at commit; nothing on SQLite)."""
    connection = db()
    statement = engine(connection).NOTIFY
    if statement is not None:
        fetchone(statement, [stream_channel(), payload], connection)


def send_notices(payloads: list[str]) -> None:
    """NOTIFY each payload on the streams' channel, in one transaction (PostgreSQL)."""
    connection = db()
    fetchone(engine(connection).NOTIFY_MANY, [stream_channel(), payloads], connection)


class _Notices:
    """The NOTIFYs of the writes committed alone, sent by one thread of the process: a
    writer goes on once its write committed, and what is given while one NOTIFY
    transaction is under way goes out in the next, each payload once (a woken reader
    reads all that follows its offset). A transaction that NOTIFYs commits behind a
    database-wide lock, so one per write made writers queue; now one serves a batch.
    A NOTIFY that fails is logged, not sent again: readers look again without one
    (``runtime.stream_listener.recheck_after``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._given = threading.Condition(self._lock)
        self._payloads: dict[str, None] = {}  # in the order given, each once
        self._thread: threading.Thread | None = None
        self._stopping = False

    def give(self, payload: str) -> None:
        with self._lock:
            self._payloads[payload] = None
            if self._thread is None or not self._thread.is_alive():  # ended, or forked
                self._thread = threading.Thread(
                    target=self._run, name="django-durable-stream-notices", daemon=True
                )
                self._thread.start()
            self._given.notify()

    def stop(self) -> None:
        """Send what was given and end the thread, its connection closed."""
        with self._lock:
            thread, self._stopping = self._thread, True
            self._given.notify()
        if thread is not None:
            thread.join(NOTICES_IDLE)
        with self._lock:
            self._stopping = False

    def _take(self) -> list[str] | None:
        """What was given, once there is any; None when stopping with nothing left,
        or after NOTICES_IDLE without (the next ``give`` starts another thread)."""
        with self._lock:
            self._given.wait_for(lambda: self._payloads or self._stopping, NOTICES_IDLE)
            if not self._payloads:
                self._thread = None
                return None
            payloads, self._payloads = list(self._payloads), {}
            return payloads

    def _run(self) -> None:
        try:
            while (payloads := self._take()) is not None:
                try:
                    send_notices(payloads)
                except Error as exc:  # the database's, a lost connection's too
                    db().close()
                    logger.warning(
                        "waking the readers of %d stream(s) failed (%s): they read "
                        "again without it, within 5 s or DURABLE['POLL_INTERVAL']",
                        len(payloads),
                        exc,
                    )
        finally:
            connections.close_all()  # this thread's


_notices = _Notices()
os.register_at_fork(after_in_child=_notices.__init__)  # no lock held by a lost thread
atexit.register(_notices.stop)  # what a step wrote last wakes its readers at once


def stop_stream_notices() -> None:
    """Send the NOTIFYs of writes still waiting and end the notices thread, closing its
    connection (before a database it uses is dropped)."""
    _notices.stop()


def side_connection():
    """This thread's second connection to django-durable's database, for writes made
    while the thread's own connection is inside a transaction (autocommit)."""
    connection = getattr(_local, "connection", None)
    if connection is None:
        connection = _local.connection = connections.create_connection(alias())
    return connection


def release_side_connection() -> None:
    """Close this thread's side connection, if it made one: the step that needed it is
    over (runtime.calling calls this after each step and undo)."""
    connection = getattr(_local, "connection", None)
    if connection is not None:
        _local.connection = None
        connection.close()


def _writing_connection(join: bool):
    """The thread's connection in autocommit, or when told to ``join`` the transaction
    it is in (one that was open before the step began: a test's, around ``drain()``);
    otherwise (the step opened a transaction) the thread's side connection."""
    connection = db()
    return connection if join or connection.get_autocommit() else side_connection()


@dataclass(frozen=True)
class StreamWrite:
    """What a write is told: the writer (its claim: ``fence``, its step and attempt)
    and the value's JSON text (checked by the caller)."""

    run_id: uuid.UUID
    name: str
    value_json: str
    step: str
    step_index: int
    attempt: int
    fence: int
    max_items: int
    keep_latest: bool = False
    # Write in the transaction the thread's connection is in, if any (see
    # ``_writing_connection``).
    join: bool = False


def _prep(connection, model, field: str, value: Any) -> Any:
    return model._meta.get_field(field).get_db_prep_value(value, connection)


def write_stream(write: StreamWrite) -> tuple[int, bool] | None:
    """Write one item (and a reset item before it when the stream's last writer was an
    earlier execution of the same step), committed when this returns. Returns (the
    stream's item count, whether a reset went first), or None when nothing was written:
    the run is not this claim's, the stream is closed or full (``stream_refusal``)."""
    connection = _writing_connection(write.join)
    at = now(connection)
    params = {
        "run_id": _prep(connection, Stream, "run", write.run_id),
        "name": write.name,
        "value": write.value_json,
        "keep_latest": write.keep_latest,
        "step": write.step,
        "step_index": write.step_index,
        "attempt": write.attempt,
        "fence": write.fence,
        "max_items": write.max_items,
        "now": _prep(connection, StreamEntry, "written_at", at),
    }
    statements = engine(connection)
    if statements.WRITE_STREAM is not None:
        items, reset = fetchone(statements.WRITE_STREAM, params, connection)
        if items is None:
            return None
        _notify_written(connection, stream_payload(write.run_id, write.name))
        return items, bool(reset)
    # SQLite: the upsert, then the items, in one transaction (its first statement
    # writes, so it holds the write lock from its start).
    with _transaction(connection):
        row = fetchone(statements.UPSERT_STREAM, params, connection)
        if row is None:
            return None
        items, reset = row[0], bool(row[1])
        if reset:
            _insert_item(connection, params, items - 2, StreamEntry.Kind.RESET, None)
        _insert_item(connection, params, items - 1, StreamEntry.Kind.VALUE, params["value"])
    return items, reset


def _notify_written(connection, payload: str) -> None:
    """Wake the stream's readers once its write committed: through the process's
    notices when the write was committed alone (the writer does not wait for it);
    with the transaction the write joined, at its commit, otherwise."""
    if connection.get_autocommit():
        _notices.give(payload)
    else:  # the write joined the thread's transaction (``join``)
        notify_streams(payload)


@contextmanager
def _transaction(connection):
    """``atomic()`` on the thread's connection; a plain transaction on the side one
    (not one of Django's ``connections``, so ``atomic`` cannot name it)."""
    if connection is db():
        with atomic():
            yield
        return
    connection.set_autocommit(False)
    try:
        yield
        connection.commit()
    except BaseException:
        connection.rollback()
        raise
    finally:
        connection.set_autocommit(True)


def _insert_item(connection, params: dict, offset: int, kind: str, value: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            engine(connection).INSERT_STREAM_ITEM,
            {**params, "offset": offset, "kind": kind, "value": value},
        )


def close_stream(run_id: uuid.UUID, name: str, *, join: bool = False) -> None:
    """Close a stream (its row made if nobody wrote to it yet), committed on return."""
    connection = _writing_connection(join)
    at = now(connection)
    fetchone(
        engine(connection).CLOSE_STREAM,
        {
            "run_id": _prep(connection, Stream, "run", run_id),
            "name": name,
            "now": _prep(connection, Stream, "closed_at", at),
            "channel": stream_channel(),
            "payload": stream_payload(run_id, name),
        },
        connection,
    )


@dataclass(frozen=True)
class StreamPosition:
    """What a reader needs to know besides the items: does the run exist, is the stream
    ended (closed, or its run finished: no step can write to it any more), how many
    items it holds (0: nobody wrote to it yet)."""

    ended: bool
    items: int
    run_status: str


def stream_position(run_id: uuid.UUID, name: str) -> StreamPosition | None:
    """The stream's position, or None for an unknown run (one query)."""
    stream = Stream.objects.filter(run_id=OuterRef("pk"), name=name)
    row = (
        Run.objects.filter(id=run_id)
        .annotate(
            stream_items=Subquery(stream.values("items")[:1]),
            stream_closed=Subquery(stream.values("closed_at")[:1]),
        )
        .values_list("status", "stream_items", "stream_closed")
        .first()
    )
    if row is None:
        return None
    status, items, closed_at = row
    return StreamPosition(
        ended=closed_at is not None or status in FINISHED_STATUSES,
        items=items or 0,
        run_status=status,
    )


def read_stream(
    run_id: uuid.UUID, name: str, after: int, limit: int
) -> tuple[list[tuple[int, str, Any, str, int, datetime]], StreamPosition | None]:
    """Up to ``limit`` items with an offset above ``after``, oldest first, and the
    stream's position read with them (None: an unknown run): one statement where the
    engine has it (``READ_STREAM``), else ``read_stream_items`` then ``stream_position``."""
    connection = db()
    statement = engine(connection).READ_STREAM
    if statement is None:
        return read_stream_items(run_id, name, after, limit), stream_position(run_id, name)
    params = {"run_id": _prep(connection, Stream, "run", run_id), "name": name}
    rows = fetchall(statement, {**params, "after": after, "limit": limit}, connection)
    if not rows:
        return [], None
    status, count, closed_at = rows[0][:3]
    position = StreamPosition(
        ended=closed_at is not None or status in FINISHED_STATUSES,
        items=count or 0,
        run_status=status,
    )
    value = StreamEntry._meta.get_field("value")
    items = [
        (offset, kind, None if v is None else value.from_db_value(v, None, connection), *rest)
        for _status, _count, _closed, offset, kind, v, *rest in rows
        if offset is not None
    ]
    return items, position


def read_stream_items(
    run_id: uuid.UUID, name: str, after: int | None, limit: int
) -> list[tuple[int, str, Any, str, int, datetime]]:
    """Up to ``limit`` items with an offset above ``after`` (None: from the first), oldest
    first (durable_stream_item_once serves it)."""
    items = StreamEntry.objects.filter(run_id=run_id, stream=name)
    if after is not None:
        items = items.filter(offset__gt=after)
    return list(items.order_by("offset").values_list(*ITEM_COLUMNS)[:limit])


def latest_stream_items(run_id: uuid.UUID, name: str, count: int) -> list[tuple]:
    """The stream's last ``count`` items, oldest first."""
    rows = StreamEntry.objects.filter(run_id=run_id, stream=name).order_by("-offset")
    return list(reversed(rows.values_list(*ITEM_COLUMNS)[:count]))


def run_streams(run_id: uuid.UUID) -> list[tuple[str, int, datetime | None, Any]]:
    """The run's streams: (name, items, closed_at, latest), by name."""
    return list(
        Stream.objects.filter(run_id=run_id)
        .order_by("name")
        .values_list("name", "items", "closed_at", "latest")
    )


def stream_refusal(run_id: uuid.UUID, name: str, fence: int) -> str:
    """Why a write wrote nothing: "not owned" (the claim lost the run, or a newer claim
    wrote to the stream), "closed" or "full"."""
    owned = Run.objects.filter(
        id=run_id, fence=fence, status__in=["running", "compensating"]
    ).exists()
    stream = (
        Stream.objects.filter(run_id=run_id, name=name).values_list("closed_at", "fence").first()
    )
    if not owned or (stream is not None and stream[1] is not None and stream[1] > fence):
        return "not owned"
    if stream is not None and stream[0] is not None:
        return "closed"
    return "full"


def latest_values(run_ids: list[uuid.UUID], name: str) -> dict[uuid.UUID, Any]:
    """The latest value kept for stream ``name`` of each of ``run_ids`` (Run.progress)."""
    rows = Stream.objects.filter(run_id__in=run_ids, name=name).values_list("run_id", "latest")
    return dict(rows)
