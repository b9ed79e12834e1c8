"""Periodic pruning from the worker: ``DURABLE["PRUNE_INTERVAL"]`` (None: never).

``scheduler.fire_due()``, which workers call on their loop, calls
``prune_if_due()``; each process prunes at most once per interval. Pruning is
idempotent and batched, so two workers pruning at once only share the work.
"""

from __future__ import annotations

import logging
import time

from . import conf

logger = logging.getLogger("django_durable.retention")

_last_prune: float | None = None


def prune_if_due() -> int | None:
    """Prune if ``PRUNE_INTERVAL`` has passed since this process last did; return
    how many runs were pruned, or None when it was not time."""
    global _last_prune
    interval = conf.get("PRUNE_INTERVAL")
    if interval is None:
        return None
    now = time.monotonic()
    if _last_prune is not None and now - _last_prune < interval.total_seconds():
        return None
    _last_prune = now
    from .services import prune

    pruned = prune()
    if pruned:
        logger.info("pruned %d finished runs", pruned)
    return pruned
