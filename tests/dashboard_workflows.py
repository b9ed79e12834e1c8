"""Workflows the dashboard's tests show: one run with retries, a wait for input,
a child run and a compensation, and a workflow waiting for an event."""

import django_durable as durable
from django_durable import Workflow, step


class DashLabel(Workflow):
    name = "dash_label"

    @step
    def print_label(self, ctx):
        return {"label": f"label for {ctx.input['order']}"}


class DashOrder(Workflow):
    """reserve → charge (fails once, retried) → approve (waits for input) →
    label (a child run) → ship (fails when asked): the reservation is undone."""

    name = "dash_order"

    @step(compensate="unreserve")
    def reserve(self, ctx):
        ctx.put("reserved", True)

    @step(retries=2, backoff=durable.seconds(0))
    def charge(self, ctx):
        if ctx.attempt == 1:
            raise RuntimeError("card declined, trying again")

    @step
    def approve(self, ctx):
        return ctx.wait_for_input("approval")

    @step
    def label(self, ctx):
        return ctx.call_workflow(DashLabel, {"order": ctx.input.get("order", 1)})

    @step
    def ship(self, ctx):
        if ctx.input.get("fail_ship"):
            raise RuntimeError("the carrier refused the parcel")

    def unreserve(self, ctx):
        ctx.put("reserved", False)


class DashAwaitsEvent(Workflow):
    name = "dash_awaits_event"

    @step
    def wait(self, ctx):
        return ctx.wait_for_event("paid")
