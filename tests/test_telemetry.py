"""OpenTelemetry spans and metrics, captured with the SDK's in-memory exporters."""

import pytest
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import django_durable as durable
from django_durable import telemetry
from django_durable.testing import drain
from tests.testapp.workflows import Flaky, SendInvoice, SyncAccount

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def otel():
    exporter = InMemorySpanExporter()
    tracer_provider = sdk_trace.TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry.install(tracer_provider=tracer_provider, meter_provider=meter_provider)
    yield exporter, reader
    telemetry.install()  # back to the global (no-op) providers
    tracer_provider.shutdown()
    meter_provider.shutdown()


def points(reader, name):
    """{frozenset(attributes): value} of one metric."""
    found = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        value = getattr(point, "value", None)
                        if value is None:
                            value = point.count
                        found[frozenset(point.attributes.items())] = value
    return found


def test_a_run_gives_a_run_span_and_step_spans_in_the_run_trace(otel):
    exporter, reader = otel
    run_id = durable.start(Flaky, {"failures": 1}, key="flaky:1")
    drain()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    run_span = spans["durable.run flaky"]
    assert run_span.context.trace_id == run_id.int
    assert run_span.attributes["durable.status"] == "completed"
    assert run_span.attributes["durable.key"] == "flaky:1"
    steps = [s for s in exporter.get_finished_spans() if s.name == "durable.step flaky.wobble"]
    assert [s.attributes["durable.outcome"] for s in steps] == ["failed", "completed"]
    assert all(s.context.trace_id == run_id.int for s in steps)
    assert steps[0].status.status_code is StatusCode.ERROR
    assert steps[0].events[0].attributes["exception.type"] == "ValueError"
    assert spans["durable.start"].attributes["durable.run_id"] == str(run_id)

    assert points(reader, "durable.runs.started") == {
        frozenset({"durable.workflow": "flaky", "durable.keyed": True}.items()): 1
    }
    assert points(reader, "durable.runs.finished") == {
        frozenset({"durable.workflow": "flaky", "durable.status": "completed"}.items()): 1
    }
    steps_metric = points(reader, "durable.steps")
    assert sorted(dict(k)["durable.outcome"] for k in steps_metric) == ["completed", "failed"]
    assert sum(points(reader, "durable.step.duration").values()) == 2


def test_key_duplicates_handoffs_and_releases_are_counted_and_traced(otel):
    exporter, reader = otel
    holder = durable.start(SendInvoice, {"id": 1}, key="invoice:1")
    with pytest.raises(durable.KeyTaken):
        durable.start(SendInvoice, {"id": 1, "amount": 5}, key="invoice:1")
    sync = durable.start(SyncAccount, {}, key="account:1")
    drain()
    durable.start(SyncAccount, {}, key="account:1")  # the finished holder hands off
    durable.release_key(holder, by="ops@example.com")

    duplicates = points(reader, "durable.key.duplicates")
    assert duplicates == {
        frozenset(
            {
                "durable.workflow": "send_invoice",
                "durable.outcome": "error",
                "durable.input_changed": True,
            }.items()
        ): 1
    }
    assert points(reader, "durable.key.handoffs") == {
        frozenset({"durable.workflow": "sync_account"}.items()): 1
    }
    assert points(reader, "durable.key.releases") == {
        frozenset({"durable.workflow": "send_invoice"}.items()): 1
    }
    by_name = {}
    for span in exporter.get_finished_spans():
        by_name.setdefault(span.name, []).append(span)
    (duplicate,) = by_name["durable.key.duplicate"]
    assert duplicate.attributes["durable.key"] == "invoice:1"
    assert duplicate.attributes["durable.run_id"] == str(holder)
    (handoff,) = by_name["durable.key.handoff"]
    assert handoff.attributes["durable.from_run_id"] == str(sync)
    (release,) = by_name["durable.key.release"]
    assert release.attributes["durable.by"] == "ops@example.com"


def test_without_a_provider_nothing_is_measured_and_no_query_is_made(
    django_assert_num_queries,
):
    # The global providers are the API's proxies: telemetry must cost nothing.
    telemetry.install()
    run_id = durable.start(SyncAccount, {}, key="account:9")
    with django_assert_num_queries(0):
        telemetry._run_finished(
            None, run_id=run_id, workflow="sync_account", key=None, status="completed"
        )


def test_uninstall_disconnects_the_receivers(otel):
    exporter, _ = otel
    telemetry.uninstall()
    durable.start(SyncAccount, {}, key="account:2")
    drain()
    assert exporter.get_finished_spans() == ()
