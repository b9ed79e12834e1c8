"""The Key view of a run: what happened to its key, and the inputs it dropped.

A re-add that got the existing run (``use_existing``, ``error``) with a
different input *dropped* that input; the view shows it as a diff against the
input of the run that answered it.
"""

from __future__ import annotations

import difflib
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.db.models import TextField
from django.db.models.functions import Cast, Substr

from django_durable import query
from django_durable.models import Activity, Run

RUNS_SHOWN = 100
READDS_SHOWN = 50
# Inputs longer than this (as JSON text) are not diffed: the page would carry
# them whole. The run page links to the whole input instead.
DIFF_CHARS = 20_000
BIG_FIELDS = ("input", "context", "result", "state")


@dataclass
class DiffLine:
    kind: str  # "add", "remove", "hunk", "context"
    text: str


@dataclass
class Readd:
    activity: Activity
    outcome: str
    input_changed: bool
    dropped: bool
    answered_by: uuid.UUID | None
    diff: list[DiffLine] = field(default_factory=list)
    too_big: bool = False  # dropped, but one of the inputs is too long to diff


@dataclass
class KeyView:
    key: str
    workflow: str
    holder: Run | None
    runs: list[Run]
    more_runs: bool
    readds: list[Readd]
    history: list[Activity]


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def input_diff(kept: Any, dropped: Any) -> list[DiffLine]:
    """A unified diff of two inputs, as pretty JSON, line by line (for escaping
    by the template, never as HTML)."""
    lines = difflib.unified_diff(
        pretty(kept).splitlines(),
        pretty(dropped).splitlines(),
        fromfile="input of the run",
        tofile="dropped input",
        lineterm="",
    )
    out = []
    for line in lines:
        if line.startswith(("---", "+++")):
            kind = "header"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "remove"
        else:
            kind = "context"
        out.append(DiffLine(kind, line))
    return out


def build(run: Run) -> KeyView | None:
    """The Key view of ``run``, or None when it was started without a key."""
    if run.key is None:
        return None
    # A run of the key may hold a result of many megabytes: the list needs none
    # of its values, and the diffs read only the inputs they compare.
    keyed = query.runs_with_key(run.workflow, run.key).defer(*BIG_FIELDS)
    runs = list(keyed[: RUNS_SHOWN + 1])
    more = len(runs) > RUNS_SHOWN
    runs = runs[:RUNS_SHOWN]
    holder = next((r for r in runs if r.holds_key), None)
    if holder is None:
        holder = keyed.filter(holds_key=True).first()

    rows = list(query.readds(run.workflow, run.key).order_by("-created_at", "-id")[:READDS_SHOWN])
    readds = []
    for activity in rows:
        details = activity.details or {}
        outcome = str(details.get("outcome", ""))
        changed = details.get("input_changed") is True
        dropped = changed and outcome in query.DROPPING_OUTCOMES
        readds.append(Readd(activity, outcome, changed, dropped, activity.run_id))
    inputs = _inputs_to_diff({r.answered_by for r in readds if r.dropped} - {None})
    for readd in readds:
        if not readd.dropped or readd.answered_by not in inputs:
            continue
        kept = inputs[readd.answered_by]
        dropped_input = (readd.activity.details or {}).get("input")
        if kept is _TOO_BIG or len(pretty(dropped_input)) > DIFF_CHARS:
            readd.too_big = True
        else:
            readd.diff = input_diff(kept, dropped_input)
    history = [
        a
        for a in query.key_activity(run.workflow, run.key, limit=READDS_SHOWN)
        if a.kind != Activity.Kind.KEY_DUPLICATE
    ]
    return KeyView(run.key, run.workflow, holder, runs, more, readds, history)


_TOO_BIG = object()


def _inputs_to_diff(run_ids: set) -> dict:
    """The inputs of ``run_ids``, read as at most ``DIFF_CHARS + 1`` characters
    of text each; a longer one is ``_TOO_BIG`` (one query, none when no id)."""
    if not run_ids:
        return {}
    heads = (
        Run.objects.filter(id__in=run_ids)
        .annotate(_head=Substr(Cast("input", TextField()), 1, DIFF_CHARS + 1))
        .values_list("id", "_head")
    )
    inputs = {}
    for run_id, head in heads:
        text = head or "null"
        inputs[run_id] = _TOO_BIG if len(text) > DIFF_CHARS else json.loads(text)
    return inputs
