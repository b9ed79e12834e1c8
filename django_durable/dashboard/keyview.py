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

from django_durable import query
from django_durable.models import Activity, Run

RUNS_SHOWN = 100
READDS_SHOWN = 50


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
    runs = list(query.runs_with_key(run.workflow, run.key)[: RUNS_SHOWN + 1])
    more = len(runs) > RUNS_SHOWN
    runs = runs[:RUNS_SHOWN]
    holder = next((r for r in runs if r.holds_key), None)
    if holder is None:
        holder = query.runs_with_key(run.workflow, run.key).filter(holds_key=True).first()

    rows = list(query.readds(run.workflow, run.key).order_by("-created_at", "-id")[:READDS_SHOWN])
    inputs = {r.id: r.input for r in runs}
    missing = {a.run_id for a in rows if a.run_id is not None and a.run_id not in inputs}
    if missing:
        inputs.update(Run.objects.filter(id__in=missing).values_list("id", "input"))
    readds = []
    for activity in rows:
        details = activity.details or {}
        outcome = str(details.get("outcome", ""))
        changed = details.get("input_changed") is True
        dropped = changed and outcome in query.DROPPING_OUTCOMES
        readd = Readd(activity, outcome, changed, dropped, activity.run_id)
        if dropped and activity.run_id in inputs:
            readd.diff = input_diff(inputs[activity.run_id], details.get("input"))
        readds.append(readd)
    history = [
        a
        for a in query.key_activity(run.workflow, run.key, limit=READDS_SHOWN)
        if a.kind != Activity.Kind.KEY_DUPLICATE
    ]
    return KeyView(run.key, run.workflow, holder, runs, more, readds, history)
