"""A run's progress and streams on its page, progress in the runs list, and the
dashboard's stream view (docs/streams.md, docs/dashboard.md).

The run page's live part (polled like every live part) shows the progress bar and,
for each stream, its item count and latest items: two queries whatever the number of
items (the streams' rows, then the latest items of each shown stream by offset range,
which ``durable_stream_item_once`` serves). A value is shown as the head of its JSON
text, which the template escapes: never as HTML. The runs list reads the progress of
the page's unfinished runs in one query. The stream view sends a stream as
Server-Sent Events to users who may see the run (``guard``, like the run page).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q, TextField
from django.db.models.functions import Cast, Length, Substr
from django.http import Http404

import django_durable as durable
from django_durable import query
from django_durable.models import PROGRESS_STREAM, Run, StreamEntry
from django_durable.operations.streams import check_stream_name

STREAMS_SHOWN = 10
ITEMS_SHOWN = 10
ITEM_CHARS = 300


@dataclass(frozen=True)
class Progress:
    done: float
    total: float | None
    message: str | None
    at: str

    @classmethod
    def of(cls, value: dict | None) -> Progress | None:
        if not isinstance(value, dict) or "done" not in value:
            return None
        return cls(value["done"], value.get("total"), value.get("message"), value.get("at", ""))

    @property
    def percent(self) -> int | None:
        """How far, when ``total`` is known (a bar); None otherwise (a count)."""
        if not self.total:
            return None
        return min(100, round(100 * self.done / self.total))


@dataclass(frozen=True)
class ShownItem:
    offset: int
    kind: str
    text: str  # the head of the value's JSON
    truncated: bool
    step: str
    attempt: int
    written_at: datetime


@dataclass
class ShownStream:
    name: str
    items: int
    closed: bool
    latest: list[ShownItem]


def run_streams(run: Run) -> dict:
    """The run page's ``progress``, ``streams`` (the first STREAMS_SHOWN by name, each
    with its latest ITEMS_SHOWN items) and ``streams_more`` (how many more)."""
    rows = query.run_streams(run.id)
    progress = next((latest for name, _, _, latest in rows if name == PROGRESS_STREAM), None)
    shown = [
        ShownStream(name, items, closed_at is not None or run.is_finished, [])
        for name, items, closed_at, _ in rows[:STREAMS_SHOWN]
    ]
    ranges = Q()
    for stream in shown:
        if stream.items:
            ranges |= Q(stream=stream.name, offset__gte=stream.items - ITEMS_SHOWN)
    if ranges:
        by_name = {stream.name: stream for stream in shown}
        for name, item in _items(run, ranges):
            by_name[name].latest.append(item)
    return {
        "progress": Progress.of(progress),
        "streams": shown,
        "streams_more": max(0, len(rows) - STREAMS_SHOWN),
    }


def _items(run: Run, ranges: Q) -> list[tuple[str, ShownItem]]:
    text = Cast("value", TextField())
    rows = (
        StreamEntry.objects.filter(ranges, run_id=run.id)
        .annotate(head=Substr(text, 1, ITEM_CHARS), size=Length(text))
        .order_by("stream", "offset")
        .values_list("stream", "offset", "kind", "head", "size", "step", "attempt", "written_at")
    )
    return [
        (name, ShownItem(offset, kind, head or "null", (size or 0) > ITEM_CHARS, step, n, at))
        for name, offset, kind, head, size, step, n, at in rows
    ]


def add_progress(runs: list[Run]) -> None:
    """Set ``shown_progress`` on the unfinished runs of a page that reported progress
    (one query, none when every run finished)."""
    going = [run for run in runs if not run.is_finished]
    if not going:
        return
    found = query.latest_progress([run.id for run in going])
    for run in going:
        run.shown_progress = Progress.of(found.get(run.id))


def stream(request, run_admin, run_id, name):
    """The stream ``name`` of the run as Server-Sent Events (``durable.stream_response``)."""
    try:
        check_stream_name(name)
    except ValueError:
        raise Http404(f"no stream {name!r}") from None
    if not Run.objects.filter(id=run_id).exists():
        raise Http404(f"no run {run_id}")
    return durable.stream_response(request, run_id, name)
