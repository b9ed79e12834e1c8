"""The turns a claim gave, where the engine's CLAIM does not record them itself
(SQLite: its TAKE_TURNS runs after the claim, only when it claimed a run with a flow
key; durable_claim_v6 records them in its own statement on PostgreSQL). Turns only
order the claims (no limit depends on them), so they need no transaction with it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

__all__ = ["take_turns"]


def take_turns(runs: Sequence[Any], at: datetime, connection, statement: str) -> None:
    """Record the turns of the runs a claim took with the engine's TAKE_TURNS
    (``statement``), when one has a flow key: a claim of runs without any leaves the
    table alone (nothing to take turns with)."""
    if not any(run.flow_key is not None for run in runs):
        return
    turns = sorted({(run.queue, run.flow_key or "") for run in runs})
    with connection.cursor() as cursor:
        cursor.execute(statement, {"turns": json.dumps(turns), "now": at})
