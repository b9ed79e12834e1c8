"""Spans and metrics of runs, steps and keys, from django-durable's signals (and
the saving of step attempts), so the engine itself knows nothing of them.

The run span and the step spans of a run are in the run's own trace and link to
the span the run was started in (``links``). Starts, duplicates, hand-offs and
releases are short spans in whatever trace is current (the web request's, usually).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.apps import apps

from django_durable.telemetry import instruments, links
from django_durable.telemetry.instruments import Instruments, RunFacts, on

if instruments.AVAILABLE:
    from opentelemetry.trace import StatusCode


def _ns(at: datetime | None) -> int | None:
    return int(at.timestamp() * 1_000_000_000) if at is not None else None


def read_facts(run_id: uuid.UUID) -> RunFacts:
    """A run's workflow, queue and trace context, read once per run a process meets."""
    Run = apps.get_model("django_durable", "Run")
    row = Run.objects.filter(id=run_id).values_list("workflow", "queue", "trace_context").first()
    return RunFacts(*row) if row is not None else RunFacts("?", None, None)


def _key_attributes(workflow: str, key: str | None, **more: Any) -> dict[str, Any]:
    attributes = {"durable.workflow": workflow, **more}
    if key is not None:
        attributes["durable.key"] = key
    return attributes


def _instant_span(inst: Instruments, name: str, attributes: dict) -> None:
    with inst.tracer.start_as_current_span(name, attributes=attributes):
        pass


def run_started(sender, run_id, workflow, key, **kwargs):
    inst = on()
    if inst is None:
        return
    inst.runs_started.add(1, {"durable.workflow": workflow, "durable.keyed": key is not None})
    _instant_span(
        inst, "durable.start", _key_attributes(workflow, key, **{"durable.run_id": str(run_id)})
    )


def run_finished(sender, run_id, workflow, key, status, **kwargs):
    inst = on()
    if inst is None:
        return
    Run = apps.get_model("django_durable", "Run")
    inst.runs_finished.add(1, {"durable.workflow": workflow, "durable.status": status})
    times = (
        Run.objects.filter(id=run_id)
        .values("created_at", "started_at", "finished_at", "trace_context")
        .first()
    )
    if times is None:
        return
    end = times["finished_at"]
    if end is not None:
        inst.run_duration.record(
            (end - times["created_at"]).total_seconds(), {"durable.workflow": workflow}
        )
    span = inst.tracer.start_span(
        f"durable.run {workflow}",
        context=links.run_trace_context(run_id),
        links=links.links_to(times["trace_context"]),
        start_time=_ns(times["started_at"] or times["created_at"]),
        attributes=_key_attributes(
            workflow, key, **{"durable.run_id": str(run_id), "durable.status": status}
        ),
    )
    if status in ("failed", "compensation_failed"):
        span.set_status(StatusCode.ERROR, f"run {status}")
    span.end(end_time=_ns(end))


def attempt_recorded(sender, attempt, **kwargs):
    inst = on()
    if inst is not None:
        _step_span(inst, attempt)  # sent after commit


def _step_span(inst: Instruments, attempt) -> None:
    facts = inst.facts(attempt.run_id, read_facts)
    workflow = facts.workflow
    labels = {
        "durable.workflow": workflow,
        "durable.step": attempt.step,
        "durable.outcome": attempt.status,
    }
    inst.steps.add(1, labels)
    if attempt.finished_at is not None:
        inst.step_duration.record(
            (attempt.finished_at - attempt.started_at).total_seconds(), labels
        )
    span = inst.tracer.start_span(
        f"durable.step {workflow}.{attempt.step}",
        context=links.run_trace_context(attempt.run_id),
        links=links.links_to(facts.trace_context),
        start_time=_ns(attempt.started_at),
        attributes={
            **labels,
            "durable.run_id": str(attempt.run_id),
            "durable.attempt": attempt.attempt,
            "durable.kind": attempt.kind,
        },
    )
    if attempt.error:
        error = (
            attempt.error if isinstance(attempt.error, dict) else {"message": str(attempt.error)}
        )
        span.add_event(
            "exception",
            {
                "exception.type": str(error.get("type", "")),
                "exception.message": str(error.get("message", "")),
            },
        )
        span.set_status(StatusCode.ERROR, str(error.get("message", ""))[:200])
    span.end(end_time=_ns(attempt.finished_at))


def key_duplicate(sender, run_id, workflow, key, outcome, input_changed, **kwargs):
    inst = on()
    if inst is None:
        return
    inst.key_duplicates.add(
        1,
        {
            "durable.workflow": workflow,
            "durable.outcome": outcome,
            "durable.input_changed": bool(input_changed),
        },
    )
    _instant_span(
        inst,
        "durable.key.duplicate",
        _key_attributes(
            workflow,
            key,
            **{
                "durable.run_id": str(run_id),
                "durable.outcome": outcome,
                "durable.input_changed": bool(input_changed),
            },
        ),
    )


def key_handoff(sender, from_run_id, to_run_id, workflow, key, **kwargs):
    inst = on()
    if inst is None:
        return
    inst.key_handoffs.add(1, {"durable.workflow": workflow})
    _instant_span(
        inst,
        "durable.key.handoff",
        _key_attributes(
            workflow,
            key,
            **{
                "durable.from_run_id": str(from_run_id) if from_run_id else "",
                "durable.to_run_id": str(to_run_id),
            },
        ),
    )


def key_release(sender, run_id, workflow, key, by, **kwargs):
    inst = on()
    if inst is None:
        return
    inst.key_releases.add(1, {"durable.workflow": workflow})
    _instant_span(
        inst,
        "durable.key.release",
        _key_attributes(workflow, key, **{"durable.run_id": str(run_id), "durable.by": by or ""}),
    )
