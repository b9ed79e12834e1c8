"""``durable.stream_response``: a stream as Server-Sent Events for a Django view
(docs/streams.md).

Each item is one event (``id: <offset>``, ``event: value`` or ``reset``, ``data:`` its
JSON on one line); a ``Last-Event-ID`` header resumes after that offset; a comment
line goes out whenever ``DURABLE["STREAM_HEARTBEAT"]`` (15 s) passed without an
event, so proxies keep the connection; ``event: close`` ends it once the stream is
ended (closed, its run finished, or no such run) and every item was sent.

It checks no permission: the view that returns it decides who may read. Values are
sent as JSON text, never as HTML, with ``<``, ``>`` and ``&`` as JSON escapes, so a
page that swaps the data into its HTML shows the JSON text as is. Under ASGI the
body is an async iterator (``aread_stream``: no thread, no connection per client
while it waits); under WSGI a sync one (``read_stream``: the server's thread for the
request).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator

from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, StreamingHttpResponse
from django.utils.cache import add_never_cache_headers

from django_durable import conf
from django_durable.models import Run
from django_durable.operations.streams import check_stream_name
from django_durable.runtime.stream_reader import (
    StreamItem,
    aread_stream,
    astream_ended,
    read_stream,
    stream_ended,
)

__all__ = ["event_data", "event_text", "stream_response"]

CLOSE = "event: close\ndata: \n\n"
HEARTBEAT = ": keep-alive\n\n"
_CLOSE, _HEARTBEAT = CLOSE.encode(), HEARTBEAT.encode()


# ``<``, ``>`` and ``&`` as JSON escapes: the same value when parsed, and no markup
# for a page that swaps the data in as HTML (htmx's ``sse-swap``) to find.
_MARKUP = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def event_data(value) -> str:
    """An item's value as one line of JSON without ``<``, ``>`` or ``&`` (``json.dumps``
    escapes line breaks inside strings; outside strings JSON has none of the three)."""
    return json.dumps(value).translate(_MARKUP)


def event_text(item: StreamItem) -> str:
    """One item as an event: ``event_data`` on one ``data:`` line."""
    return f"id: {item.offset}\nevent: {item.kind}\ndata: {event_data(item.value)}\n\n"


def _resume_after(request: HttpRequest) -> int:
    """The offset a reconnecting client saw last (``Last-Event-ID``), -1 for none."""
    value = request.headers.get("Last-Event-ID", "").strip()
    return int(value) if value.isdigit() else -1


def _heartbeat() -> float:
    return conf.get("STREAM_HEARTBEAT").total_seconds()


def _sync_events(run_id, name: str, after: int) -> Iterator[str]:
    yield HEARTBEAT  # the headers go out now, not at the first item
    while True:
        try:
            for item in read_stream(run_id, name, after=after, timeout=_heartbeat()):
                after = item.offset
                yield event_text(item)
            if stream_ended(run_id, name, after):
                break
        except Run.DoesNotExist:
            break
        yield HEARTBEAT
    yield CLOSE


# The frames of the items async readers sent last, by (run, stream, offset): the
# readers of a stream woken by one write get the same item from one shared read, and
# the first of them encodes its frame for all (an item at an offset never changes).
# Bounded, oldest out first.
_frames: dict[tuple, bytes] = {}
FRAMES_KEPT = 4096


def _frame(run_id, name: str, item: StreamItem) -> bytes:
    key = (run_id, name, item.offset)
    frame = _frames.get(key)
    if frame is None:
        frame = _frames[key] = event_text(item).encode()
        if len(_frames) > FRAMES_KEPT:
            # Loops of other threads may trim at the same time: whoever trims, once.
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                del _frames[next(iter(_frames))]
    return frame


async def _async_events(run_id, name: str, after: int) -> AsyncIterator[bytes]:
    # Django's StreamingHttpResponse takes a TypeError out of an async body for "not an
    # async iterator" and iterates it again as a sync one, which hides the real error:
    # ours (a bad connection option, a bug) leaves as a RuntimeError naming it.
    try:
        yield _HEARTBEAT
        while True:
            try:
                async for item in aread_stream(run_id, name, after=after, timeout=_heartbeat()):
                    after = item.offset
                    yield _frame(run_id, name, item)
                if await astream_ended(run_id, name, after):
                    break
            except Run.DoesNotExist:
                break
            yield _HEARTBEAT
        yield _CLOSE
    except TypeError as exc:
        raise RuntimeError(f"the stream's events failed: {exc!r}") from exc


def stream_response(
    request: HttpRequest, run_id: uuid.UUID | str, name: str = "default"
) -> StreamingHttpResponse:
    """The stream ``name`` of run ``run_id`` as Server-Sent Events, resumed after the
    request's ``Last-Event-ID``. No query is made here (an async view may call it)."""
    name = check_stream_name(name)
    after = _resume_after(request)
    if isinstance(request, ASGIRequest):
        body = _async_events(run_id, name, after)
    else:
        body = _sync_events(run_id, name, after)
    response = StreamingHttpResponse(body, content_type="text/event-stream")
    add_never_cache_headers(response)
    response["Cache-Control"] = "no-cache, no-store, must-revalidate, max-age=0, private"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on as it comes
    return response
