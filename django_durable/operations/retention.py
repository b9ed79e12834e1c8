"""Which finished runs ``prune()`` deletes when workflows say how long to keep them
(``Workflow.retention``, per outcome; ``workflows.retention``), and what the dashboard
says of it."""

from __future__ import annotations

import functools
import operator
from datetime import datetime, timedelta

from django.db.models import Q

from django_durable import conf
from django_durable.workflows.definition import Workflow, registry
from django_durable.workflows.retention import FINISHED

__all__ = ["condition", "kept_for", "limited"]


def condition(at: datetime, default: timedelta | None) -> Q | None:
    """The finished runs past retention at ``at``, as a filter: per workflow and
    status where ``retention`` names it (``None``: kept), ``default``
    (``DURABLE["RUN_RETENTION"]``) for every other; None when no workflow declares a
    retention (then ``default`` alone applies, as ``prune()`` always did)."""
    named: list[Q] = []
    due: list[Q] = []
    for workflow in registry.all():
        for status, keep in (workflow.retention or {}).items():
            named.append(Q(workflow=workflow.name, status=status))
            if keep is not None:
                due.append(Q(workflow=workflow.name, status=status, finished_at__lt=at - keep))
    if not named:
        return None
    if default is not None:
        rest = Q(finished_at__lt=at - default)
        for each in named:
            rest &= ~each
        due.append(rest)
    if not due:
        return Q(pk__in=[])
    return functools.reduce(operator.or_, due)


def limited() -> bool:
    """Whether some workflow keeps a finished status for a limited time (so the
    worker's pruning has something to do even without ``RUN_RETENTION``)."""
    return any(
        keep is not None
        for workflow in registry.all()
        for keep in (workflow.retention or {}).values()
    )


def kept_for(workflow: type[Workflow]) -> list[tuple[str, timedelta | None, bool]]:
    """How long each finished status of ``workflow`` is kept: (status, duration or
    None for "until pruned by hand", whether the workflow names it)."""
    default = conf.get("RUN_RETENTION")
    named = workflow.retention or {}
    return [
        (status, named[status], True) if status in named else (status, default, False)
        for status in FINISHED
    ]
