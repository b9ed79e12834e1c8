"""Runs waiting for a person: ``list_pending_inputs`` (and ``alist_pending_inputs``).

Each waiting run's ``wait_for_input`` recorded its kind, prompt, choices, when it
began to wait and when it times out in the run's state (``state.pending_wait``),
so the list is one bounded query and no more.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async

from django_durable import store
from django_durable.operations import state as run_state
from django_durable.workflows.definition import Workflow, registry

__all__ = ["MAX_PENDING_INPUTS", "alist_pending_inputs", "list_pending_inputs"]

# The most runs one call lists (the oldest waits first).
MAX_PENDING_INPUTS = 1000


def list_pending_inputs(
    workflow: str | type[Workflow] | None = None, *, limit: int = MAX_PENDING_INPUTS
) -> list[dict[str, Any]]:
    """Runs waiting in ``ctx.wait_for_input`` now, oldest first: dicts with ``run_id``,
    ``workflow``, ``name``, ``kind``, ``prompt``, ``choices`` (a list, or None),
    ``waiting_since`` and ``timeout_at`` (aware datetimes; ``timeout_at`` None when
    the wait has no timeout).

    ``workflow`` (a name or a ``Workflow`` class) keeps that workflow's runs; without
    it, the runs of every workflow defined in the code. The query reads the index on
    ``(workflow, status)``: one range per workflow, holding only its waiting runs
    (never the whole runs table), and returns at most ``limit`` rows (1,000 by
    default). ``ValueError`` for a ``limit`` that is not a positive int.
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"limit must be a positive int, got {limit!r}")
    if workflow is None:
        names = sorted(w.name for w in registry.all())
    elif isinstance(workflow, str):
        names = [workflow]
    elif isinstance(workflow, type) and issubclass(workflow, Workflow):
        names = [workflow.name]
    else:
        raise TypeError(f"workflow must be a name or a Workflow class, got {workflow!r}")
    listed = []
    for run in store.waiting_for_input(names, limit):
        wait = run_state.pending_wait(run.state)
        if wait["kind"] != "input":
            continue  # its state names no input wait (a run being resumed just now)
        listed.append(
            {
                "run_id": run.id,
                "workflow": run.workflow,
                "name": wait["name"],
                "kind": wait["input_kind"],
                "prompt": wait["prompt"],
                "choices": wait["choices"],
                "waiting_since": _time(wait["since"]) or run.created_at,
                "timeout_at": _time(wait["timeout_at"]),
            }
        )
    return listed


async def alist_pending_inputs(
    workflow: str | type[Workflow] | None = None, *, limit: int = MAX_PENDING_INPUTS
) -> list[dict[str, Any]]:
    """``list_pending_inputs()`` for async code."""
    return await sync_to_async(list_pending_inputs, thread_sensitive=True)(workflow, limit=limit)


def _time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None
