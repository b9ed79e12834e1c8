"""Flow control by key, the operations' part (docs/flow-control.md): the limits a
claim applies, translated from the workflows' declarations (``workflows.declared``)
into the store's ``FlowLimit``, and when a rate next lets a held run begin. What an
operator asks about them (``flow_stats``, ``explain_run``) is in operations/
flow_reports.py.

The caller of ``store.claim`` passes ``claim_limits()`` (the worker, at every claim;
``testing.drain`` passes ``shifted_limits``): the store reads no declaration.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from django_durable import store
from django_durable.workflows.declared import declared_limits
from django_durable.workflows.definition import registry
from django_durable.workflows.flow import FlowLimits

__all__ = ["claim_limits", "limits_of", "next_rate_window_end", "shifted_limits"]

_cache: tuple[int, dict[str, store.FlowLimit]] = (-1, {})


def limits_of(declared: Mapping[str, FlowLimits]) -> dict[str, store.FlowLimit]:
    """The store's ``FlowLimit`` by workflow name, from declarations."""
    return {
        name: store.FlowLimit(
            limits.concurrency_per_key,
            limits.concurrency,
            limits.rate.limit if limits.rate is not None else None,
            limits.rate.per if limits.rate is not None else None,
        )
        for name, limits in declared.items()
    }


def claim_limits() -> dict[str, store.FlowLimit]:
    """The flow limits of the registered workflows, by name, as a claim takes them
    (translated once per change of the registry)."""
    global _cache
    version, limits = _cache
    if version != registry.version:
        limits = limits_of(declared_limits())
        _cache = (registry.version, limits)
    return limits


def shifted_limits(shift: timedelta) -> dict[str, store.FlowLimit]:
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
