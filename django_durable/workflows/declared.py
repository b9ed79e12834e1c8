"""The flow limits the registered workflows declare (``workflows.flow.FlowLimits``),
read once per change of the registry, not at every claim: what the worker's claims
apply (operations/flow.py turns them into the store's ``FlowLimit``) and what the
metrics count held back (telemetry). A limit set on a class after it was defined
applies from the next (un)registration of any workflow, or the next worker start.
"""

from __future__ import annotations

from django_durable.workflows.definition import registry
from django_durable.workflows.flow import FlowLimits, flow_limits

__all__ = ["declared_limits"]

_cache: tuple[int, dict[str, FlowLimits]] = (-1, {})


def declared_limits() -> dict[str, FlowLimits]:
    """The flow limits of every registered workflow that has any, by name."""
    global _cache
    version, limits = _cache
    if version != registry.version:
        limits = {}
        for workflow in registry.all():
            found = flow_limits(workflow)
            if found is not None:
                limits[workflow.name] = found
        _cache = (registry.version, limits)
    return limits
