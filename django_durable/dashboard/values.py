"""Big JSON values (input, context, result) shown truncated, downloadable whole.

A run page must not carry a 32 MB result: the database sends only the first
``SHOWN`` characters of each value (and its length), the page shows them as
text with a link to download the whole value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from django.db.models import QuerySet, TextField
from django.db.models.functions import Cast, Length, Substr
from django.http import Http404, HttpResponse

from django_durable.dashboard.keyview import pretty
from django_durable.models import Event, Run

FIELDS = ("input", "context", "result")
SHOWN = 20_000
EVENTS_SHOWN = 100
EVENT_CHARS = 500


@dataclass
class Value:
    field: str
    text: str | None  # None: the value is NULL
    size: int
    truncated: bool


def load_run(run_id) -> tuple[Run, dict[str, Value]]:
    """The run without its big values, and the head of each value (the inputs a
    debounce folded into it are not shown: they are not read either)."""
    run = with_heads(Run.objects.defer("inputs"), FIELDS).get(id=run_id)
    return run, heads(run, FIELDS)


def with_heads(runs: QuerySet, fields: tuple[str, ...]) -> QuerySet:
    """``runs`` without the values of ``fields``, each read as the first ``SHOWN``
    characters of its JSON text and its length instead (``heads`` reads them)."""
    annotations = {}
    for name in fields:
        text = Cast(name, TextField())
        annotations[f"_{name}_head"] = Substr(text, 1, SHOWN)
        annotations[f"_{name}_size"] = Length(text)
    return runs.defer(*fields).annotate(**annotations)


def heads(run: Run, fields: tuple[str, ...]) -> dict[str, Value]:
    """The head of each of ``fields`` of a run read through ``with_heads``."""
    values = {}
    for name in fields:
        head = getattr(run, f"_{name}_head")
        size = getattr(run, f"_{name}_size") or 0
        if head is None or head == "null":
            values[name] = Value(name, None, 0, False)
        elif size <= SHOWN:
            values[name] = Value(name, pretty(json.loads(head)), size, False)
        else:
            values[name] = Value(name, head, size, True)
    return values


def download(request, run_admin, run_id, field: str) -> HttpResponse:
    """The whole value as a JSON file."""
    if field not in FIELDS:
        raise Http404(f"no value {field!r}")
    rows = Run.objects.filter(id=run_id).annotate(_text=Cast(field, TextField()))
    found = rows.values_list("id", "_text").first()
    if found is None:
        raise Http404(f"no run {run_id}")
    response = HttpResponse(found[1] or "null", content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="run-{run_id}-{field}.json"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


def events_of(run: Run) -> list[Event]:
    """The run's first events and inputs, each payload as the head of its JSON
    text (``payload_head``): a list of 100 never carries a payload whole."""
    head = Substr(Cast("payload", TextField()), 1, EVENT_CHARS + 1)
    rows = Event.objects.filter(run=run).defer("payload").annotate(payload_head=head)
    return list(rows.order_by("id")[:EVENTS_SHOWN])
