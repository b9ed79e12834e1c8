"""``Workflow.retention``: how long finished runs of a workflow are kept, per outcome
(docs/pruning.md, "Retention by workflow and outcome").

``retention = {"completed": days(7), "failed": days(90)}``: a finished status named
there is kept that long (``None``: until ``prune(older_than=...)``), a status not
named falls back to ``DURABLE["RUN_RETENTION"]``. Checked when the class is defined
(``ImproperlyConfigured``) and again by the system checks (``django_durable.E030``),
which also see a value set on the class afterwards.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

__all__ = ["FINISHED", "retention_problem", "validated_retention"]

# The finished statuses (models.FINISHED_STATUSES; a test keeps them equal). Written
# out: a definition is imported before the app registry is ready, without models.
FINISHED = ("completed", "failed", "cancelled", "compensated", "compensation_failed")


def retention_problem(value: Any) -> str | None:
    """What is wrong with a ``retention`` value, or None when it is good."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return f"retention must be a dict of status -> timedelta or None, got {value!r}"
    for status, keep in value.items():
        if status not in FINISHED:
            return (
                f"retention names {status!r}, which is not a finished status "
                f"({', '.join(FINISHED)})"
            )
        if keep is not None and (not isinstance(keep, timedelta) or keep < timedelta(0)):
            return (
                f"retention of {status!r} must be a timedelta of at least 0 or None, got {keep!r}"
            )
    return None


def validated_retention(value: Any, where: str) -> dict[str, timedelta | None] | None:
    """``value`` as a workflow keeps it (a copy), or ``ValueError`` naming ``where``."""
    problem = retention_problem(value)
    if problem is not None:
        raise ValueError(f"{where}: {problem}")
    return dict(value) if value is not None else None
