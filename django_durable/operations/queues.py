"""Queues as operators see them: ``pause_queue``, ``resume_queue`` and
``queue_stats``.

A paused queue's runs are not claimed (runs already running finish); starts into
it go on being accepted. Concurrency limits are settings
(``DURABLE["QUEUES"][name]["concurrency"]``), enforced by the claim itself
(``store.claims``), so every worker, ``drain()`` included, honours them.
"""

from __future__ import annotations

from typing import Any

from django_durable import conf, store

__all__ = ["pause_queue", "queue_stats", "resume_queue"]


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a queue name is a non-empty string, got {name!r}")
    if len(name) > 100:
        raise ValueError("a queue name is at most 100 characters")
    return name


def pause_queue(name: str) -> None:
    """Stop workers claiming runs of queue ``name`` (runs already running finish)."""
    store.set_paused(_check_name(name), True)


def resume_queue(name: str) -> None:
    """Let workers claim runs of queue ``name`` again, and wake the idle ones."""
    store.set_paused(_check_name(name), False)
    store.notify_due(name)


def queue_stats(name: str | None = None) -> list[dict[str, Any]]:
    """One dict per queue (those with active runs, paused ones and configured ones,
    or just ``name``), by name: ``queue``, ``paused``, ``pending``, ``due`` (claimable
    now), ``running``, ``waiting``, ``oldest_due_seconds`` (how long the oldest due
    run has waited; None when none is due) and ``concurrency`` (its limit or None)."""
    if name is not None:
        _check_name(name)
    counts, at = store.queue_counts(name)
    paused = store.paused_queues()
    limits = conf.queue_limits()
    names = set(counts) | paused | set(limits) if name is None else {name}
    stats = []
    for queue in sorted(names):
        row = counts.get(queue, {})
        oldest = row.get("oldest_due_at")
        stats.append(
            {
                "queue": queue,
                "paused": queue in paused,
                "pending": row.get("pending", 0),
                "due": row.get("due", 0),
                "running": row.get("running", 0),
                "waiting": row.get("waiting", 0),
                "oldest_due_seconds": max((at - oldest).total_seconds(), 0.0)
                if oldest is not None
                else None,
                "concurrency": limits.get(queue),
            }
        )
    return stats
