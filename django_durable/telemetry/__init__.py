"""OpenTelemetry spans and metrics for runs, steps, keys and the engine, and the
structured fields of the engine's log records.

Active when ``opentelemetry-api`` is importable; without it every function here
is a no-op (``log_fields`` works either way). The span and run metrics observe
django-durable's signals (``signals.observe``), so the engine knows nothing of
them; the engine's own metrics (claims, pickup, recoveries, hand-backs, lease
losses, queue depth) come from hooks that cost a None check while telemetry is not
installed. Nothing is measured, and no query is made, until the process has a real
tracer or meter provider (the API's default providers record nothing).

- ``spans``: the run, step, start and key spans and the run metrics;
- ``links``: the trace context a run is started in, and the links to it;
- ``engine``: the worker and queue metrics (docs/metrics.md);
- ``logs``: ``log_fields``, the ``extra=`` of every record about a run.
"""

from __future__ import annotations

from django_durable import signals, store
from django_durable.telemetry import engine, instruments, spans
from django_durable.telemetry.engine import handed_back, lease_lost, recovered
from django_durable.telemetry.instruments import AVAILABLE, SCOPE, Instruments
from django_durable.telemetry.links import (
    in_run_trace,
    links_to,
    run_trace_context,
    trace_context,
)
from django_durable.telemetry.logs import LOG_FIELDS, log_fields
from django_durable.telemetry.spans import run_finished as _run_finished

__all__ = [
    "AVAILABLE",
    "LOG_FIELDS",
    "SCOPE",
    "in_run_trace",
    "handed_back",
    "install",
    "lease_lost",
    "links_to",
    "log_fields",
    "recovered",
    "run_trace_context",
    "trace_context",
    "uninstall",
]

# What telemetry observes (``signals.observe``: called where each signal is sent,
# not connected as a receiver, so that a start pays nothing for it until something
# listens).
_OBSERVERS = (
    (signals.run_started, spans.run_started),
    (signals.run_finished, _run_finished),
    (signals.key_duplicate, spans.key_duplicate),
    (signals.key_handoff, spans.key_handoff),
    (signals.key_release, spans.key_release),
    (signals.attempt_recorded, spans.attempt_recorded),
)


def install(tracer_provider=None, meter_provider=None, *, queue_depth: bool = True) -> bool:
    """Start reporting (done at startup when opentelemetry-api is installed).

    Without providers, the global ones are used (set them with the SDK as usual).
    ``queue_depth=False`` leaves out the ``durable.queue.depth`` and
    ``durable.flow.held`` gauges, whose callbacks read the database at each
    collection. Returns False when
    opentelemetry-api is not installed.
    """
    if not AVAILABLE:
        return False
    depth = engine.observe_depth if queue_depth else None
    held = engine.observe_flow if queue_depth else None
    current = instruments.current = Instruments(
        tracer_provider, meter_provider, observe_depth=depth, observe_flow=held
    )
    for signal, observer in _OBSERVERS:
        # Called only while a provider listens: until then a signal costs a start nothing.
        signals.observe(signal, observer, when=current.active)
    store.watch_claims(engine.claimed)
    return True


def uninstall() -> None:
    """Stop reporting."""
    instruments.current = None
    store.watch_claims(None)
    for signal, _observer in _OBSERVERS:
        signals.observe(signal, None)
