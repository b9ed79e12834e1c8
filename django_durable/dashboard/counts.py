"""Counts the dashboard can afford on a runs table of millions of rows.

A page never counts a whole table. A count is either *bounded* (``LIMIT`` then
count: at most ``BOUND`` index entries read, shown as "10,000+") or an
*estimate* from PostgreSQL's statistics, shown as "≈" with a note saying so.
"""

from __future__ import annotations

from dataclasses import dataclass

from django_durable.models import Run, Status
from django_durable.stats import status_estimates
from django_durable.workflows.definition import registry

BOUND = 10_000


@dataclass(frozen=True)
class Count:
    """A number as the page may show it."""

    value: int
    more: bool = False  # the true number is larger (a bounded count hit its bound)
    estimated: bool = False

    def __str__(self) -> str:
        text = f"{self.value:,}"
        if self.more:
            return f"{text}+"
        return f"≈{text}" if self.estimated else text


def bounded(queryset, bound: int = BOUND) -> Count:
    """How many rows ``queryset`` has, reading at most ``bound + 1`` of them."""
    n = queryset.order_by()[: bound + 1].count()
    return Count(min(n, bound), more=n > bound)


def status_counts(workflow: str | None = None) -> tuple[list[tuple[str, Count]], str | None]:
    """Runs per status and a note on how they were counted.

    One workflow: bounded counts through ``durable_run_workflow_status``. All runs:
    PostgreSQL's estimates when the table has statistics, else bounded counts per
    defined workflow and status (the same index).
    """
    if workflow is None:
        guessed = status_estimates()
        if guessed is not None:
            note = "Estimated from PostgreSQL's table statistics (as of the last ANALYZE)."
            return [(s.value, Count(guessed.get(s.value, 0), estimated=True)) for s in Status], note
        names = sorted(w.name for w in registry.all())
        runs = Run.objects.filter(workflow__in=names)
        note = f"Runs of the defined workflows, counted up to {BOUND:,} per status."
    else:
        runs = Run.objects.filter(workflow=workflow)
        note = f"Counted up to {BOUND:,} per status."
    return [(s.value, bounded(runs.filter(status=s.value))) for s in Status], note
