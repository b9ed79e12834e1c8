"""Where a run's spans are, and how they point back to what started the run.

A run's spans (the run span, its step spans) share one trace whose id is the run's
id, so a run's whole life is one search in a tracing UI, however many workers ran
it and however long it waited. The span that was current when the run was started
(a web request's, usually) is not their parent: it is stored on the run
(``Run.trace_context``, the W3C ``traceparent`` and ``tracestate`` headers, written
by the start's own INSERT) and the run's spans carry an OpenTelemetry *link* to it.

Why a link, not a parent: a run outlives its request (by seconds or by weeks), may
be retried or rerun, and one request may start thousands of runs. As children they
would stretch the request's trace to the run's end and bury it under steps; linked,
the request's trace stays the size of the request, the run's trace the size of the
run, and a tracing UI follows the link either way. Temporal and DBOS link for the
same reason.

While a step runs, the run's trace is the current one (``in_run_trace``): spans the
step opens itself (an HTTP client's, a database driver's) land in the run's trace,
and a run the step starts (``ctx.start``, a child) links back to it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from django_durable.telemetry import instruments

if instruments.AVAILABLE:
    from opentelemetry import context, trace
    from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR = TraceContextTextMapPropagator()


def trace_context() -> dict[str, str] | None:
    """The current span's context as W3C headers (``traceparent``, and ``tracestate``
    when it has one), to store on a run started now; None without telemetry installed
    or outside a span. Cheap: a context-variable read, no provider involved."""
    if instruments.current is None:
        return None
    current = trace.get_current_span().get_span_context()
    if not current.is_valid:
        return None
    # The W3C header, as the propagator writes it (it reads it back in links_to).
    headers = {
        "traceparent": (
            f"00-{current.trace_id:032x}-{current.span_id:016x}-{int(current.trace_flags):02x}"
        )
    }
    if current.trace_state:
        headers["tracestate"] = current.trace_state.to_header()
    return headers


def links_to(stored: dict | None) -> list[Any]:
    """The ``Link`` to the span a run was started in, from ``Run.trace_context``
    (none when nothing valid was stored)."""
    if not stored or not isinstance(stored, dict):
        return []
    carrier = {k: v for k, v in stored.items() if isinstance(v, str)}
    started_in = trace.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
    if not started_in.is_valid:
        return []
    return [Link(started_in, {"durable.link": "started_by"})]


def run_trace_context(run_id: uuid.UUID):
    """The context whose trace id is the run's id: the run's spans are its children."""
    span_id = (run_id.int & 0xFFFF_FFFF_FFFF_FFFF) or 1
    parent = SpanContext(
        trace_id=run_id.int or 1,
        span_id=span_id,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


def in_run_trace(run: Any) -> AbstractContextManager[None]:
    """Make ``run``'s trace the current one while a step of it runs (only while
    something listens: otherwise one check and a shared no-op context)."""
    if instruments.on() is None:
        return _NOTHING
    return _attached(run_trace_context(run.id))


_NOTHING = nullcontext()


@contextmanager
def _attached(current: Any) -> Iterator[None]:
    token = context.attach(current)
    try:
        yield
    finally:
        context.detach(token)
