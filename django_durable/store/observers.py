"""The hook through which ``django_durable.telemetry`` times claims: the store knows
nothing of telemetry, and while no watcher is set (telemetry not installed) a claim
pays one None check for it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

__all__ = ["watch_claims"]

# Called after every claim with (claimed runs, seconds the claim took, lease, queues).
claim_watcher: Callable[[list[Any], float, timedelta, Sequence[str] | None], None] | None = None


def watch_claims(
    watcher: Callable[[list[Any], float, timedelta, Sequence[str] | None], None] | None,
) -> None:
    """Set (or with None, remove) the one claim watcher."""
    global claim_watcher
    claim_watcher = watcher
