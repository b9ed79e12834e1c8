"""A run started inside a span remembers that span's context (W3C traceparent and
tracestate, written by the start's own INSERT), and the run's spans link to it; a
step's spans and the runs it starts are in the run's trace. Captured with the SDK's
in-memory exporter, with real runs drained or run by a worker."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from opentelemetry import trace
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

import django_durable as durable
from django_durable import step, telemetry
from django_durable.models import Run
from django_durable.testing import drain
from tests.testapp.workflows import Flaky, SyncAccount

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def traced():
    exporter = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.install(tracer_provider=provider)
    yield exporter, provider.get_tracer("tests.request")
    telemetry.install()  # back to the global (no-op) providers
    provider.shutdown()


def traceparent(span_context) -> str:
    return (
        f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}"
        f"-{int(span_context.trace_flags):02x}"
    )


def linked_contexts(span):
    return [(link.context.trace_id, link.context.span_id) for link in span.links]


def test_the_runs_spans_link_to_the_request_span_that_started_it(traced):
    exporter, tracer = traced
    with tracer.start_as_current_span("POST /orders") as request:
        run_id = durable.start(Flaky, {"failures": 1}, key="order:7")
    asked = request.get_span_context()
    assert Run.objects.get(id=run_id).trace_context == {"traceparent": traceparent(asked)}
    drain()

    spans = exporter.get_finished_spans()
    run_span = next(s for s in spans if s.name == "durable.run flaky")
    steps = [s for s in spans if s.name == "durable.step flaky.wobble"]
    assert len(steps) == 2  # a failed attempt and the one that completed
    for span in [run_span, *steps]:
        assert span.context.trace_id == run_id.int  # the run's own trace...
        assert linked_contexts(span) == [(asked.trace_id, asked.span_id)]  # ...linked
        assert span.links[0].attributes["durable.link"] == "started_by"
    # The start itself is a short span inside the request's trace.
    start_span = next(s for s in spans if s.name == "durable.start")
    assert start_span.parent.span_id == asked.span_id


def test_tracestate_is_kept_and_a_run_started_outside_a_span_stores_nothing(traced):
    _, _ = traced
    parent = SpanContext(
        trace_id=0x1234,
        span_id=0x99,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "abc")]),
    )
    with trace.use_span(NonRecordingSpan(parent)):
        inside = durable.start(SyncAccount, {}, key="acct:1")
    outside = durable.start(SyncAccount, {}, key="acct:2")
    assert Run.objects.get(id=inside).trace_context == {
        "traceparent": f"00-{0x1234:032x}-{0x99:016x}-01",
        "tracestate": "vendor=abc",
    }
    assert Run.objects.get(id=outside).trace_context is None


def test_start_many_and_astart_store_the_context_too(traced):
    exporter, tracer = traced
    with tracer.start_as_current_span("import batch") as batch:
        results = durable.start_many(SyncAccount, [({}, "many:1"), ({}, None), ({}, "many:2")])
    wanted = {"traceparent": traceparent(batch.get_span_context())}
    ids = [r.run_id for r in results]
    assert [Run.objects.get(id=i).trace_context for i in ids] == [wanted] * 3

    async def view():
        with tracer.start_as_current_span("async view") as span:
            return span, await durable.astart(SyncAccount, {}, key="async:1")

    span, run_id = async_to_sync(view)()
    asked = span.get_span_context()
    assert Run.objects.get(id=run_id).trace_context == {"traceparent": traceparent(asked)}
    drain()
    run_span = next(
        s
        for s in exporter.get_finished_spans()
        if s.name == "durable.run sync_account" and s.context.trace_id == run_id.int
    )
    assert linked_contexts(run_span) == [(asked.trace_id, asked.span_id)]


def starts_a_child(self, ctx):
    return str(ctx.start(SyncAccount, {}, key="child-of-traced"))


def test_a_step_runs_in_its_runs_trace_and_the_runs_it_starts_link_to_it(traced, define):
    exporter, _ = traced
    parent_id = durable.start(define("starts_traced_child", go=step(starts_a_child)))
    assert Run.objects.get(id=parent_id).trace_context is None  # started outside a span
    drain()
    child_id = Run.objects.get(id=parent_id).result
    # The child was started inside the parent's trace (whose id is the parent's id).
    stored = Run.objects.get(id=child_id).trace_context
    assert stored["traceparent"].startswith(f"00-{parent_id.hex}-")
    (child_span,) = [
        s
        for s in exporter.get_finished_spans()
        if s.name == "durable.run sync_account" and s.attributes["durable.run_id"] == child_id
    ]
    assert [link.context.trace_id for link in child_span.links] == [parent_id.int]


def test_a_start_inside_a_span_is_still_one_statement(traced, django_assert_num_queries):
    _, tracer = traced
    with tracer.start_as_current_span("request"), django_assert_num_queries(1):
        durable.start(SyncAccount, {}, key="one-statement")


def test_uninstalled_telemetry_stores_nothing(traced):
    _, tracer = traced
    telemetry.uninstall()
    with tracer.start_as_current_span("request"):
        run_id = durable.start(SyncAccount, {}, key="uninstalled")
    assert Run.objects.get(id=run_id).trace_context is None


@pytest.mark.django_db(transaction=False)
def test_without_opentelemetry_installed_nothing_breaks_and_nothing_is_stored():
    script = """
import sys
sys.modules["opentelemetry"] = None  # as if the package were not installed
import django
django.setup()
from django_durable import telemetry
assert telemetry.AVAILABLE is False
assert telemetry.install() is False
assert telemetry.trace_context() is None
from django_durable.models import Run
run = Run(workflow="w", key="k", queue="q", attempt=1, step_names=["a"], step_index=0)
fields = telemetry.log_fields(run)
assert fields["workflow"] == "w" and fields["step"] == "a", fields
with telemetry.in_run_trace(run):
    pass
print("ok")
"""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
