"""OpenTelemetry spans and metrics for runs, steps and keys.

Active when ``opentelemetry-api`` is importable; without it every function here
is a no-op. The receivers listen to django-durable's signals (and to the
saving of step attempts), so the engine itself knows nothing of telemetry.
Nothing is measured, and no query is made, until the process has a real
tracer or meter provider (the API's default providers record nothing).

Spans of one run share a trace whose id is the run's id (``run_id.hex``), so a
run's steps line up in a tracing UI however many workers ran them. Starts,
duplicates and releases are short spans in whatever trace is current (the web
request's, usually).
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from datetime import datetime
from typing import Any

from django.apps import apps

from django_durable import signals

try:  # opentelemetry is optional
    from opentelemetry import metrics, trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, StatusCode, TraceFlags
except ImportError:  # pragma: no cover - exercised when the package is absent
    metrics = trace = None

AVAILABLE = trace is not None
SCOPE = "django_durable"
_WORKFLOW_CACHE_SIZE = 2048


class _Instruments:
    def __init__(self, tracer_provider=None, meter_provider=None):
        self.explicit = tracer_provider is not None or meter_provider is not None
        self.tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, meter_provider=meter_provider)
        self.runs_started = meter.create_counter(
            "durable.runs.started", unit="{run}", description="Runs created"
        )
        self.runs_finished = meter.create_counter(
            "durable.runs.finished", unit="{run}", description="Runs that finished, by status"
        )
        self.run_duration = meter.create_histogram(
            "durable.run.duration", unit="s", description="From a run's creation to its end"
        )
        self.steps = meter.create_counter(
            "durable.steps", unit="{attempt}", description="Step attempts, by outcome"
        )
        self.step_duration = meter.create_histogram(
            "durable.step.duration", unit="s", description="How long a step attempt took"
        )
        self.key_duplicates = meter.create_counter(
            "durable.key.duplicates",
            unit="{start}",
            description="Starts that found their key taken, by outcome",
        )
        self.key_handoffs = meter.create_counter(
            "durable.key.handoffs", unit="{handoff}", description="Keys that moved to a new run"
        )
        self.key_releases = meter.create_counter(
            "durable.key.releases", unit="{release}", description="Keys released by hand"
        )
        self.workflows: OrderedDict[uuid.UUID, str] = OrderedDict()
        self.listening = False
        self.checked_until = 0.0

    def active(self) -> bool:
        """Is anything listening? (The API's default proxies record nothing.) A project
        sets its providers once, at startup: asked again at most once a second."""
        if self.explicit:
            return True
        at = time.monotonic()
        if at < self.checked_until:
            return self.listening
        proxies = (trace.ProxyTracerProvider,)
        meter_proxy = type(metrics.get_meter_provider()).__name__ == "_ProxyMeterProvider"
        self.listening = not isinstance(trace.get_tracer_provider(), proxies) or not meter_proxy
        self.checked_until = at + (1.0 if not self.listening else float("inf"))
        return self.listening


_instruments: _Instruments | None = None


def install(tracer_provider=None, meter_provider=None) -> bool:
    """Start reporting (done at startup when opentelemetry-api is installed).

    Without providers, the global ones are used (set them with the SDK as
    usual). Returns False when opentelemetry-api is not installed.
    """
    global _instruments
    if not AVAILABLE:
        return False
    _instruments = _Instruments(tracer_provider, meter_provider)
    signals.run_started.connect(_run_started, dispatch_uid="durable-otel-run-started")
    signals.run_finished.connect(_run_finished, dispatch_uid="durable-otel-run-finished")
    signals.key_duplicate.connect(_key_duplicate, dispatch_uid="durable-otel-key-duplicate")
    signals.key_handoff.connect(_key_handoff, dispatch_uid="durable-otel-key-handoff")
    signals.key_release.connect(_key_release, dispatch_uid="durable-otel-key-release")
    signals.attempt_recorded.connect(_attempt_recorded, dispatch_uid="durable-otel-step")
    return True


def uninstall() -> None:
    """Stop reporting."""
    global _instruments
    _instruments = None
    for signal, uid in (
        (signals.run_started, "durable-otel-run-started"),
        (signals.run_finished, "durable-otel-run-finished"),
        (signals.key_duplicate, "durable-otel-key-duplicate"),
        (signals.key_handoff, "durable-otel-key-handoff"),
        (signals.key_release, "durable-otel-key-release"),
        (signals.attempt_recorded, "durable-otel-step"),
    ):
        signal.disconnect(dispatch_uid=uid)


def _on() -> _Instruments | None:
    inst = _instruments
    return inst if inst is not None and inst.active() else None


def _ns(at: datetime | None) -> int | None:
    return int(at.timestamp() * 1_000_000_000) if at is not None else None


def run_trace_context(run_id: uuid.UUID):
    """The context whose trace id is the run's id: its spans are children of it."""
    span_id = (run_id.int & 0xFFFF_FFFF_FFFF_FFFF) or 1
    parent = SpanContext(
        trace_id=run_id.int or 1,
        span_id=span_id,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


def _key_attributes(workflow: str, key: str | None, **more: Any) -> dict[str, Any]:
    attributes = {"durable.workflow": workflow, **more}
    if key is not None:
        attributes["durable.key"] = key
    return attributes


def _instant_span(inst: _Instruments, name: str, attributes: dict) -> None:
    with inst.tracer.start_as_current_span(name, attributes=attributes):
        pass


def _run_started(sender, run_id, workflow, key, **kwargs):
    inst = _on()
    if inst is None:
        return
    _remember(inst, run_id, workflow)
    inst.runs_started.add(1, {"durable.workflow": workflow, "durable.keyed": key is not None})
    _instant_span(
        inst, "durable.start", _key_attributes(workflow, key, **{"durable.run_id": str(run_id)})
    )


def _run_finished(sender, run_id, workflow, key, status, **kwargs):
    inst = _on()
    if inst is None:
        return
    Run = apps.get_model("django_durable", "Run")
    inst.runs_finished.add(1, {"durable.workflow": workflow, "durable.status": status})
    times = Run.objects.filter(id=run_id).values("created_at", "started_at", "finished_at").first()
    if times is None:
        return
    end = times["finished_at"]
    if end is not None:
        inst.run_duration.record(
            (end - times["created_at"]).total_seconds(), {"durable.workflow": workflow}
        )
    span = inst.tracer.start_span(
        f"durable.run {workflow}",
        context=run_trace_context(run_id),
        start_time=_ns(times["started_at"] or times["created_at"]),
        attributes=_key_attributes(
            workflow, key, **{"durable.run_id": str(run_id), "durable.status": status}
        ),
    )
    if status in ("failed", "compensation_failed"):
        span.set_status(StatusCode.ERROR, f"run {status}")
    span.end(end_time=_ns(end))


def _remember(inst: _Instruments, run_id: uuid.UUID, workflow: str) -> None:
    inst.workflows[run_id] = workflow
    inst.workflows.move_to_end(run_id)
    while len(inst.workflows) > _WORKFLOW_CACHE_SIZE:
        inst.workflows.popitem(last=False)


def _workflow_of(inst: _Instruments, run_id: uuid.UUID) -> str:
    name = inst.workflows.get(run_id)
    if name is None:
        Run = apps.get_model("django_durable", "Run")
        name = Run.objects.filter(id=run_id).values_list("workflow", flat=True).first() or "?"
        _remember(inst, run_id, name)
    return name


def _attempt_recorded(sender, attempt, **kwargs):
    if _on() is not None:
        _step_span(attempt)  # sent after commit


def _step_span(attempt) -> None:
    inst = _on()
    if inst is None:
        return
    workflow = _workflow_of(inst, attempt.run_id)
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
        context=run_trace_context(attempt.run_id),
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


def _key_duplicate(sender, run_id, workflow, key, outcome, input_changed, **kwargs):
    inst = _on()
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


def _key_handoff(sender, from_run_id, to_run_id, workflow, key, **kwargs):
    inst = _on()
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


def _key_release(sender, run_id, workflow, key, by, **kwargs):
    inst = _on()
    if inst is None:
        return
    inst.key_releases.add(1, {"durable.workflow": workflow})
    _instant_span(
        inst,
        "durable.key.release",
        _key_attributes(workflow, key, **{"durable.run_id": str(run_id), "durable.by": by or ""}),
    )
