"""A run's timeline and flow graph, computed here and drawn by the templates
(SVG for the timeline, HTML boxes for the graph; no JavaScript).

The timeline puts every attempt on one time axis, and the gaps between them:
the time a run waited in the queue, a backoff after a failed attempt, a wait
(sleep, event, input) after a suspended one. The flow graph shows the steps of
the workflow in order with their statuses, the compensations that ran (the
path back), and the child runs each step started.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django_durable.models import Run, StepAttempt

WIDTH = 1000  # the SVG's user units; it scales to the page's width
ROW = 22


@dataclass
class Bar:
    label: str
    kind: str  # "queued", "attempt", "compensation", "backoff", "wait"
    status: str
    start: datetime
    end: datetime
    open: bool = False  # still going (drawn up to now)
    x: float = 0
    width: float = 0
    y: int = 0
    offset_text: str = ""

    @property
    def duration(self) -> timedelta:
        return self.end - self.start

    @property
    def duration_text(self) -> str:
        return human_duration(self.duration)


@dataclass
class Timeline:
    bars: list[Bar]
    start: datetime
    end: datetime
    ticks: list[tuple[float, str]]
    height: int

    @property
    def total(self) -> timedelta:
        return self.end - self.start


def human_duration(delta: timedelta | None) -> str:
    """12 ms, 3.4 s, 5 min 2 s, 2 h 5 min, 3 d 4 h."""
    if delta is None:
        return "—"
    seconds = max(delta.total_seconds(), 0)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {sec} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def _gap(previous: StepAttempt, following: StepAttempt | None, now: datetime) -> Bar | None:
    ended = previous.finished_at
    if ended is None:
        return None
    following_start = following.started_at if following is not None else None
    end = following_start or now
    if following is not None and following.kind != previous.kind:
        return Bar("compensations start", "queued", "pending", ended, end)
    if previous.status == StepAttempt.Outcome.SUSPENDED:
        return Bar(f"{previous.step}: wait", "wait", "waiting", ended, end, following_start is None)
    if previous.status == StepAttempt.Outcome.FAILED and following_start is not None:
        return Bar(f"{previous.step}: backoff", "backoff", "pending", ended, end)
    return None


def build(run: Run, attempts: list[StepAttempt], now: datetime) -> Timeline | None:
    """The bars of ``run``'s timeline, placed on its axis; None before any attempt."""
    if not attempts:
        return None
    bars = []
    first = attempts[0].started_at
    if first > run.created_at:
        bars.append(Bar("queued", "queued", "pending", run.created_at, first))
    for i, attempt in enumerate(attempts):
        kind = "compensation" if attempt.kind == StepAttempt.Kind.COMPENSATION else "attempt"
        still = attempt.finished_at is None
        label = f"{attempt.step} #{attempt.attempt}"
        end = attempt.finished_at or now
        bars.append(Bar(label, kind, attempt.status, attempt.started_at, end, still))
        following = attempts[i + 1] if i + 1 < len(attempts) else None
        waiting_now = following is None and run.status == "waiting"
        if following is not None or waiting_now:
            gap = _gap(attempt, following, now)
            if gap is not None:
                bars.append(gap)
    start = min(b.start for b in bars)
    end = max(max(b.end for b in bars), run.finished_at or start)
    span = max((end - start).total_seconds(), 1e-6)
    for row, bar in enumerate(bars):
        bar.x = round(WIDTH * (bar.start - start).total_seconds() / span, 1)
        bar.width = max(round(WIDTH * bar.duration.total_seconds() / span, 1), 2)
        bar.x = min(bar.x, WIDTH - bar.width)
        bar.y = row * ROW
        bar.offset_text = human_duration(bar.start - start)
    ticks = [
        (round(WIDTH * i / 4, 1), "+" + human_duration(timedelta(seconds=span * i / 4)))
        for i in range(5)
    ]
    return Timeline(bars, start, end, ticks, len(bars) * ROW)


@dataclass
class Node:
    index: int
    name: str
    # "completed", "failed", "running", "waiting", "pending", "cancelled", or "carried"
    # (over): a step before a rerun's from_step, done by its original, not run again.
    status: str
    attempts: int = 0
    compensation: str | None = None  # the compensating method, when one ran
    compensation_status: str | None = None
    children: list[Run] = field(default_factory=list)
    carried_from: uuid.UUID | None = None  # the original run that did the step


STEP_STATUS = {
    StepAttempt.Outcome.COMPLETED: "completed",
    StepAttempt.Outcome.FAILED: "failed",
    StepAttempt.Outcome.RUNNING: "running",
    StepAttempt.Outcome.SUSPENDED: "waiting",
    StepAttempt.Outcome.CANCELLED: "cancelled",
    StepAttempt.Outcome.LOST: "failed",
}


def graph(
    step_names: list[str], attempts: list[StepAttempt], children: list[Run], run: Run | None = None
) -> list[Node]:
    """The run's steps in order with what happened to each. A run started by
    ``rerun(from_step=...)`` did not run the steps before that one: they are "carried
    over" from its original (``run.rerun_of_id``), unless it has an attempt of one."""
    names = list(step_names)
    for attempt in attempts:  # a step the deployed definition no longer has
        if attempt.kind == StepAttempt.Kind.STEP and attempt.step_index >= len(names):
            names.extend(["?"] * (attempt.step_index + 1 - len(names)))
            names[attempt.step_index] = attempt.step
    nodes = [Node(i, name, "pending") for i, name in enumerate(names)]
    origin = run.rerun_from_step if run is not None else None
    if origin is not None and origin in names:
        for node in nodes[: names.index(origin)]:
            node.status, node.carried_from = "carried", run.rerun_of_id
    for attempt in attempts:
        if attempt.step_index >= len(nodes):
            continue
        node = nodes[attempt.step_index]
        if attempt.kind == StepAttempt.Kind.COMPENSATION:
            node.compensation = attempt.step
            node.compensation_status = STEP_STATUS.get(attempt.status, attempt.status)
            continue
        node.attempts = max(node.attempts, attempt.attempt)  # a resume is the same attempt
        node.status = STEP_STATUS.get(attempt.status, attempt.status)
    step_attempts = [a for a in attempts if a.kind == StepAttempt.Kind.STEP]
    for child in children:
        owner = _step_at(step_attempts, child.created_at)
        if owner is not None and owner < len(nodes):
            nodes[owner].children.append(child)
    return nodes


def _step_at(attempts: list[StepAttempt], at: datetime) -> int | None:
    """The step whose attempt was running when a child was created."""
    found = None
    for attempt in attempts:
        if attempt.started_at <= at:
            found = attempt.step_index
    return found
