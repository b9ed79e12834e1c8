"""The slots a claim gives where the engine's CLAIM does not give them itself
(SQLite): each claimed run of a limited scope (a queue's concurrency, a workflow's
concurrency, a flow key's concurrency_per_key) takes the scope's lowest free slot
number below its limit, in the claim's transaction. SQLite serialises writers, so
the claim's count of a scope's running runs was exact and a free slot exists; the
partial unique indexes (models.RUN_SLOT_CONSTRAINTS) hold there as on PostgreSQL,
where durable_claim_v6 gives the slots in its own statement.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from django_durable.models import HOLDS_WORKER, Run
from django_durable.store.flow import FlowLimit

__all__ = ["give_slots"]


def _scopes(runs, queue_caps: Mapping[str, int], flow_limits: Mapping[str, FlowLimit]):
    """The limited scopes of ``runs``: (slot field, the scope's filter, limit) -> runs."""
    scopes: dict[tuple, list[Run]] = defaultdict(list)
    for run in runs:
        if run.queue in queue_caps:
            scopes[("queue_slot", (("queue", run.queue),), queue_caps[run.queue])].append(run)
        limit = flow_limits.get(run.workflow)
        if limit is not None and limit.cap is not None:
            scopes[("workflow_slot", (("workflow", run.workflow),), limit.cap)].append(run)
        if limit is not None and limit.key_cap is not None and run.flow_key is not None:
            where = (("workflow", run.workflow), ("flow_key", run.flow_key))
            scopes[("flow_slot", where, limit.key_cap)].append(run)
    return scopes


def give_slots(
    runs: Sequence[Run], queue_caps: Mapping[str, int], flow_limits: Mapping[str, FlowLimit]
) -> None:
    """Give each of ``runs`` (just claimed, slots NULL) its slots, in the caller's
    transaction; one read per limited scope, one write per run with a slot."""
    given: dict = {}
    for (field, where, cap), members in _scopes(runs, queue_caps, flow_limits).items():
        held = set(
            Run.objects.filter(HOLDS_WORKER, **dict(where), **{f"{field}__isnull": False})
            .exclude(id__in=[r.id for r in members])
            .values_list(field, flat=True)
        )
        free = iter(s for s in range(cap) if s not in held)
        for run in members:
            slot = next(free, None)
            if slot is None:  # the claim's count left no room: a bug, not a race
                raise RuntimeError(f"no free {field} below {cap} for run {run.id}")
            setattr(run, field, slot)
            given.setdefault(run.id, {})[field] = slot
    for run_id, slots in given.items():
        Run.objects.filter(id=run_id).update(**slots)
