"""Flow control by key, the operations' part (docs/flow-control.md): the limits the
claim enforces, read from the workflows' declarations (``workflows.flow``), and
what an operator asks about them (``flow_stats``, ``explain_run``: operations/
flow_reports.py).

``claim_limits`` is what the store's claim calls at every claim (apps.py installs it
as ``store.flow.source``): it reads the declarations once per change of the
registry, not at every claim. A limit set on a class after it was defined applies
from the next (un)registration of any workflow, or the next worker start.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django_durable import store
from django_durable.store import flow as store_flow
from django_durable.workflows.definition import registry
from django_durable.workflows.flow import flow_limits

__all__ = ["claim_limits", "declared_limits", "next_rate_window_end", "shifted_limits"]

_cache: tuple[int, dict[str, store_flow.FlowLimit]] = (-1, {})


def declared_limits() -> dict:
    """``workflows.flow.FlowLimits`` of every registered workflow that has any."""
    found = {}
    for workflow in registry.all():
        limits = flow_limits(workflow)
        if limits is not None:
            found[workflow.name] = limits
    return found


def claim_limits() -> dict[str, store_flow.FlowLimit]:
    """The flow limits of the registered workflows, by name, as the claim takes them."""
    global _cache
    version, limits = _cache
    if version != registry.version:
        limits = store_flow.limits_of(declared_limits())
        _cache = (registry.version, limits)
    return limits


def shifted_limits(shift: timedelta) -> dict[str, store_flow.FlowLimit]:
    """The claim's limits as they read on a clock ``shift`` ahead of the real one
    (``testing.drain(run_timers=True)``, which jumps the runs' timers): every rate's
    window ends ``shift`` earlier, its begins being the real, recorded ones."""
    limits = claim_limits()
    if not shift:
        return limits
    return {
        name: limit._replace(per=limit.per - shift) if limit.per is not None else limit
        for name, limit in limits.items()
    }


def next_rate_window_end(shift: timedelta = timedelta(0)) -> datetime | None:
    """When the earliest rate that holds back a due run lets it begin (on the clock
    ``shift`` ahead); None when no rate holds a due run back."""
    at = store.now()
    ends = []
    for name, limit in shifted_limits(shift).items():
        if limit.rate is None:
            continue
        due = store.due_by_key(name, at=at)
        begun = store.begins_in_window(name, list(due), limit.per, at=at)
        ends += [oldest + limit.per for n, oldest in begun.values() if n >= limit.rate]
    return min(ends, default=None)
