"""The structured fields of the log records the engine writes about a run.

Every such record carries, as attributes (``extra=``), ``run_id`` (str),
``workflow``, ``key`` (None without one) and, where the run knows them, ``step``,
``attempt``, ``queue`` and ``worker_id``, so a JSON log pipeline can filter by run
(docs/observability.md, "Log fields"). Built from what the run object already
holds: a field the query that loaded the run deferred is left out, never loaded.
"""

from __future__ import annotations

from typing import Any

# The record attributes the engine sets, in the order a formatter may print them.
LOG_FIELDS = ("run_id", "workflow", "key", "step", "attempt", "queue", "worker_id")


def log_fields(run: Any, *, step: str | None = None, **known: Any) -> dict[str, Any]:
    """The ``extra=`` of a log record about ``run`` (a ``Run``).

    ``step`` names the step when the caller knows it; otherwise it is the step the
    run is at, by the step names it was started with. ``known`` overrides or adds
    (``worker_id=...``, ``attempt=...``).
    """
    loaded = vars(run)  # deferred fields are absent here: reading them would query
    fields: dict[str, Any] = {
        "run_id": str(run.pk),
        "workflow": loaded.get("workflow"),
        "key": loaded.get("key"),
    }
    if step is None:
        names, index = loaded.get("step_names"), loaded.get("step_index")
        if names and index is not None and index < len(names):
            step = names[index]
    for name, value in (
        ("step", step),
        ("attempt", loaded.get("attempt")),
        ("queue", loaded.get("queue")),
        ("worker_id", loaded.get("worker_id")),
    ):
        if value is not None:
            fields[name] = value
    fields.update((name, value) for name, value in known.items() if value is not None)
    return fields
