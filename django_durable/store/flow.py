"""Flow control by key, the store's part (docs/flow-control.md): the flow limits as
the claim takes them, and the turns a claim gave where the engine's CLAIM does not
record them itself.

The statements are the engine's (store/engines): on PostgreSQL the whole of it is in
durable_claim_v4 (its file in migrations/sql says how the limits stay exact across
workers: a lock per flow key, tried without waiting, and one per workflow with a
workflow-wide limit, then a count on a snapshot taken after the lock, in one round
trip; the turns in the same statement). SQLite serialises writers, so its CLAIM
counts and claims in one UPDATE; the turns it gave go in after it (TAKE_TURNS), only
when it claimed a run with a flow key. Turns only order the claims (no limit depends
on them), so they need no transaction with it.

The limits come from the workflows' declarations, which the store does not read:
``source`` is set by the app (apps.py) to a function returning them, as
``observers`` are; a caller may also pass them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

__all__ = [
    "FlowLimit",
    "served_limits",
    "source",
    "take_turns",
]


class FlowLimit(NamedTuple):
    """One workflow's flow limits as the claim takes them (None: no such limit)."""

    key_cap: int | None
    cap: int | None
    rate: int | None
    per: timedelta | None


# Set by the app: the flow limits of the registered workflows, by name (None: none).
source: Callable[[], Mapping[str, FlowLimit]] | None = None


def served_limits(
    limits: Mapping[str, FlowLimit] | None,
    workflows: Sequence[str] | None,
    prefixes: Sequence[str],
) -> dict[str, FlowLimit]:
    """The limits of the workflows a claimer serves (``workflows`` None: any), by
    default those of ``source``."""
    if limits is None:
        limits = source() if source is not None else {}
    if not limits or workflows is None:
        return dict(limits)
    known = set(workflows)
    return {
        name: limit
        for name, limit in limits.items()
        if name in known or any(name.startswith(p) for p in prefixes)
    }


def take_turns(runs: Sequence[Any], at: datetime, connection, statement: str) -> None:
    """Record the turns of the runs a claim took with the engine's TAKE_TURNS
    (``statement``; where the claim does not record them itself), when one has a
    flow key: a claim of runs without any leaves the table alone (nothing to take
    turns with)."""
    if not any(run.flow_key is not None for run in runs):
        return
    turns = sorted({(run.queue, run.flow_key or "") for run in runs})
    with connection.cursor() as cursor:
        cursor.execute(statement, {"turns": json.dumps(turns), "now": at})


def limits_of(declared: Mapping[str, Any]) -> dict[str, FlowLimit]:
    """FlowLimit by workflow name from declarations (``workflows.flow.FlowLimits``)."""
    return {
        name: FlowLimit(
            limits.concurrency_per_key,
            limits.concurrency,
            limits.rate.limit if limits.rate is not None else None,
            limits.rate.per if limits.rate is not None else None,
        )
        for name, limits in declared.items()
    }
