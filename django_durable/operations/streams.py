"""What a stream write, a close and a progress report decide (docs/streams.md).

The rules of API §10 for writers: a stream's name is a str of 1 to 100 bytes; a value
is JSON of at most ``DURABLE["MAX_STREAM_ITEM_BYTES"]`` bytes; a stream holds at most
``DURABLE["MAX_STREAM_ITEMS"]`` items; progress is ``done``/``total`` numbers >= 0 and
a message of at most 1,000 characters. Each is checked before anything is written.
The store writes the item (and the reset item a new execution of a step begins
with) in one statement; when it wrote nothing, this module says why: the stream is
closed (``StreamClosed``), full (``ValueError``) or the writer's claim lost the run
(``Cancelled``, as ``ctx.heartbeat()`` says).

A run's streams close when it finishes without a statement of the finish path: a
write is fenced by the writer's claim of a running run, and readers count a stream
of a finished run as closed (``store.stream_position``).
"""

from __future__ import annotations

import math
import uuid
from datetime import datetime
from typing import Any

from django_durable import conf, store
from django_durable.exceptions import Cancelled, StreamClosed
from django_durable.models import PROGRESS_STREAM
from django_durable.workflows.values import checked_json

__all__ = [
    "MAX_PROGRESS_MESSAGE",
    "MAX_STREAM_NAME_BYTES",
    "check_after",
    "check_stream_name",
    "close",
    "encode_item",
    "progress_value",
    "report_progress",
    "write",
]

MAX_STREAM_NAME_BYTES = 100
MAX_PROGRESS_MESSAGE = 1000


def check_stream_name(name: object) -> str:
    """``name`` if it is a stream's name: ``TypeError`` for a non-str, ``ValueError``
    for one outside 1 to 100 bytes of UTF-8 or one holding NUL."""
    if not isinstance(name, str):
        raise TypeError(f"a stream's name is a str, got {type(name).__name__}")
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        raise ValueError(f"stream name {name!r} is not valid text (a lone surrogate)") from None
    if not 1 <= size <= MAX_STREAM_NAME_BYTES:
        raise ValueError(f"a stream's name is 1 to 100 bytes, got {size} bytes")
    if "\x00" in name:
        raise ValueError("a stream's name cannot hold NUL")
    return name


def check_after(after: object) -> int | None:
    """A reader's ``after``: None or an int >= -1 (``TypeError``/``ValueError``)."""
    if after is None:
        return None
    if not isinstance(after, int) or isinstance(after, bool):
        raise TypeError(f"after is an int offset or None, got {type(after).__name__}")
    if after < -1:
        raise ValueError(f"after is an offset >= -1, got {after}")
    return after


def encode_item(value: Any) -> str:
    """The JSON text of an item's value: ``TypeError`` (not JSON) or ``ValueError``
    (unstorable, or over ``DURABLE["MAX_STREAM_ITEM_BYTES"]``)."""
    text, _ = checked_json(value, "a stream item")
    limit = conf.get("MAX_STREAM_ITEM_BYTES")
    size = len(text.encode())
    if size > limit:
        raise ValueError(
            f"a stream item is {size} bytes of JSON, over the limit of {limit} "
            '(DURABLE["MAX_STREAM_ITEM_BYTES"])'
        )
    return text


def _number(value: object, what: str, *, optional: bool) -> float | int | None:
    if value is None and optional:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"progress {what} is a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"progress {what} is a finite number >= 0, got {value!r}")
    return value


def progress_value(done: object, total: object, message: object, at: datetime) -> dict:
    """``Run.progress``'s value for a ``ctx.progress()`` call, checked."""
    checked_done = _number(done, "done", optional=False)
    checked_total = _number(total, "total", optional=True)
    if message is not None:
        if not isinstance(message, str):
            raise TypeError(f"a progress message is a str or None, got {type(message).__name__}")
        if len(message) > MAX_PROGRESS_MESSAGE:
            raise ValueError(
                f"a progress message is at most {MAX_PROGRESS_MESSAGE} characters, "
                f"got {len(message)}"
            )
    return {"done": checked_done, "total": checked_total, "message": message, "at": at.isoformat()}


def write(
    run,
    step: str,
    step_index: int,
    name: str,
    value: Any,
    *,
    keep_latest: bool = False,
    join: bool = False,
) -> None:
    """Write ``value`` to the stream ``name`` of ``run`` (a claimed run: its fence and
    attempt are the writer's), committed on return unless ``join``: the transaction
    that was open before the step began (a test's, around ``drain()``) holds it."""
    text = encode_item(value)
    written = store.write_stream(
        store.StreamWrite(
            run_id=run.id,
            name=name,
            value_json=text,
            step=step,
            step_index=step_index,
            attempt=run.attempt,
            fence=run.fence,
            max_items=conf.get("MAX_STREAM_ITEMS"),
            keep_latest=keep_latest,
            join=join,
        )
    )
    if written is None:
        _refused(run.id, name, run.fence)
    # Not a column: the finish of this run wakes its streams' readers (operations.finish).
    run.wrote_streams = True


def _refused(run_id: uuid.UUID, name: str, fence: int) -> None:
    reason = store.stream_refusal(run_id, name, fence)
    if reason == "closed":
        raise StreamClosed(f"stream {name!r} of run {run_id} is closed")
    if reason == "full":
        raise ValueError(
            f"stream {name!r} of run {run_id} holds DURABLE['MAX_STREAM_ITEMS'] "
            f"({conf.get('MAX_STREAM_ITEMS')}) items: no more can be written"
        )
    raise Cancelled(f"run {run_id} was cancelled or is no longer owned")


def close(run_id: uuid.UUID, name: str, *, join: bool = False) -> None:
    """Close the stream ``name`` of the run: a later write raises ``StreamClosed``."""
    store.close_stream(run_id, name, join=join)


def report_progress(
    run, step: str, step_index: int, done, total, message, *, join: bool = False
) -> None:
    """``ctx.progress()``: the run's progress, written to its ``progress`` stream, the
    latest kept for ``Run.progress``."""
    value = progress_value(done, total, message, store.now())
    write(run, step, step_index, PROGRESS_STREAM, value, keep_latest=True, join=join)
