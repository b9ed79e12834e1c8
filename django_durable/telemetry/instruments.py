"""The tracer and the instruments telemetry reports through, and whether anything
listens: ``current`` is None until ``install()`` (and after ``uninstall()``), and
``on()`` is the one check every hook makes first, so a process without
OpenTelemetry, or without a configured provider, pays a None check and nothing else.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

try:  # opentelemetry is optional
    from opentelemetry import metrics, trace
except ImportError:  # pragma: no cover - exercised when the package is absent
    metrics = trace = None

AVAILABLE = trace is not None
SCOPE = "django_durable"
# Runs whose workflow, queue and trace context a process keeps, to name and link step
# spans without a query (filled when a run is claimed, or read once on a miss).
RUN_CACHE_SIZE = 2048


# Bucket boundaries (seconds) advised for the latency histograms: the SDK's default
# ones (0, 5, 10, 25... 10000) suit milliseconds and would put every claim in one.
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
PICKUP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)


def _seconds(meter, name: str, description: str, buckets: tuple[float, ...]):
    """A histogram in seconds with advised buckets (opentelemetry-api 1.23 and later;
    an older API takes the histogram without them)."""
    try:
        return meter.create_histogram(
            name, unit="s", description=description, explicit_bucket_boundaries_advisory=buckets
        )
    except TypeError:
        return meter.create_histogram(name, unit="s", description=description)


class RunFacts(NamedTuple):
    """What step spans and metrics need of a run: its workflow, queue and the trace
    context it was started in (``Run.trace_context``)."""

    workflow: str
    queue: str | None
    trace_context: dict | None


class Instruments:
    def __init__(
        self, tracer_provider=None, meter_provider=None, observe_depth=None, observe_flow=None
    ):
        self.explicit = tracer_provider is not None or meter_provider is not None
        self.tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, meter_provider=meter_provider)
        counter, histogram = meter.create_counter, meter.create_histogram
        self.runs_started = counter(
            "durable.runs.started", unit="{run}", description="Runs created"
        )
        self.runs_finished = counter(
            "durable.runs.finished", unit="{run}", description="Runs that finished, by status"
        )
        self.run_duration = histogram(
            "durable.run.duration", unit="s", description="From a run's creation to its end"
        )
        self.steps = counter("durable.steps", unit="{attempt}", description="Step attempts")
        self.step_duration = histogram(
            "durable.step.duration", unit="s", description="How long a step attempt took"
        )
        self.key_duplicates = counter(
            "durable.key.duplicates",
            unit="{start}",
            description="Starts that found their key taken, by outcome",
        )
        self.key_handoffs = counter(
            "durable.key.handoffs", unit="{handoff}", description="Keys that moved to a new run"
        )
        self.key_releases = counter(
            "durable.key.releases", unit="{release}", description="Keys released by hand"
        )
        # The engine's own (docs/metrics.md).
        self.claim_latency = _seconds(
            meter,
            "durable.claim.latency",
            "How long a claim statement took",
            CLAIM_BUCKETS,
        )
        self.pickup_latency = _seconds(
            meter,
            "durable.pickup.latency",
            "From a run's due time to its claim, by the database's clock",
            PICKUP_BUCKETS,
        )
        self.recoveries = counter(
            "durable.recoveries",
            unit="{run}",
            description="Runs found with a lost worker (expired lease) and recovered",
        )
        self.handbacks = counter(
            "durable.handbacks",
            unit="{run}",
            description="Runs a live worker handed back after its database connection was lost",
        )
        self.lease_losses = counter(
            "durable.lease.losses",
            unit="{run}",
            description="Runs a worker found taken over by another claim",
        )
        # Flow control (docs/flow-control.md): the wait of the runs of workflows with
        # flow limits, due time to claim, by workflow and queue (never by flow key).
        self.flow_wait = _seconds(
            meter,
            "durable.flow.wait",
            "From a flow-limited run's due time to its claim, by the database's clock",
            PICKUP_BUCKETS,
        )
        self.observes_depth = observe_depth is not None
        if observe_flow is not None:
            meter.create_observable_gauge(
                "durable.flow.held",
                callbacks=[observe_flow],
                unit="{run}",
                description="Due runs held back by their workflow's flow limits, per workflow",
            )
        if observe_depth is not None:
            meter.create_observable_gauge(
                "durable.queue.depth",
                callbacks=[observe_depth],
                unit="{run}",
                description="Runs due now and not yet claimed, per queue",
            )
        self.runs: OrderedDict[uuid.UUID, RunFacts] = OrderedDict()
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

    def remember(self, run_id: uuid.UUID, facts: RunFacts) -> None:
        self.runs[run_id] = facts
        self.runs.move_to_end(run_id)
        while len(self.runs) > RUN_CACHE_SIZE:
            self.runs.popitem(last=False)

    def facts(self, run_id: uuid.UUID, read: Callable[[uuid.UUID], RunFacts]) -> RunFacts:
        found = self.runs.get(run_id)
        if found is None:
            found = read(run_id)
            self.remember(run_id, found)
        return found


current: Instruments | None = None


def on() -> Instruments | None:
    """The instruments when telemetry is installed and something listens, else None."""
    inst = current
    return inst if inst is not None and inst.active() else None


def labels(workflow: str, queue: str | None = None, **more: Any) -> dict[str, Any]:
    """Metric attributes: ``durable.workflow`` and ``durable.queue`` (never the key)."""
    found: dict[str, Any] = {"durable.workflow": workflow, **more}
    if queue is not None:
        found["durable.queue"] = queue
    return found
