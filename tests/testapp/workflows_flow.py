"""Workflows for flow control by key: each records when its step began and ended."""

import os
import time

import django_durable as durable
from django_durable import Workflow, step

from .models import FlowSpan


def tenant(input):
    return f"tenant:{input['tenant']}" if "tenant" in input else None


def _hold(ctx, workflow):
    span = FlowSpan.objects.create(
        run_id=ctx.run_id,
        workflow=workflow,
        flow_key=tenant(ctx.input),
        began=time.time(),
    )
    hold = ctx.input.get("hold_once")  # a file: the first execution holds until killed
    if hold and not os.path.exists(hold):
        open(hold, "w").close()
        time.sleep(120)
    until = ctx.input.get("until")  # a file: the step runs until the test creates it
    deadline = time.monotonic() + 120
    while until and not os.path.exists(until) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(ctx.input.get("seconds", 0.2))
    span.ended = time.time()
    span.save(update_fields=["ended"])


class PerTenant(Workflow):
    """At most 2 running runs per tenant."""

    queue = "flow"
    flow_key = staticmethod(tenant)
    # A worker process may read a lowered limit (tests of a deploy that lowers it).
    concurrency_per_key = int(os.environ.get("DURABLE_TEST_PER_TENANT_LIMIT", "2"))

    @step
    def work(self, ctx):
        _hold(ctx, "per_tenant")


class FewAtOnce(Workflow):
    """At most 2 running runs of the workflow, whatever the tenant."""

    queue = "flow"
    flow_key = staticmethod(tenant)
    concurrency = 2

    @step
    def work(self, ctx):
        _hold(ctx, "few_at_once")


class RatedPerTenant(Workflow):
    """At most 5 runs begin per tenant in any 2 seconds."""

    queue = "flow"
    flow_key = staticmethod(tenant)
    rate_per_key = durable.Rate(5, per=durable.seconds(2))

    @step
    def work(self, ctx):
        _hold(ctx, "rated_per_tenant")


class OnePerTenant(Workflow):
    """One running run per tenant (the fairness and the lost-worker tests)."""

    queue = "flow"
    flow_key = staticmethod(tenant)
    concurrency_per_key = 1

    @step
    def work(self, ctx):
        _hold(ctx, "one_per_tenant")


class Plain(Workflow):
    """No flow key and no limit, in the limited workflows' queue."""

    name = "plain_beside_limited"  # "plain" is a name tests define for themselves
    queue = "flow"

    @step
    def work(self, ctx):
        _hold(ctx, "plain")


class Turns(Workflow):
    """No limit, a flow key: taken in turns across tenants."""

    queue = "turns"
    flow_key = staticmethod(tenant)

    @step
    def work(self, ctx):
        _hold(ctx, "turns")
