"""What replay and repair reads and writes (``operations.rerun``): a new run made a
rerun of another (its origin, the step it begins at, its context), the steps a run
began, what its completed attempts replaced in its context, and a run's reruns."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import QuerySet

from django_durable.models import Run, StepAttempt

__all__ = ["began_steps", "make_rerun", "replaced_values", "rerun_already", "reruns_of"]


def make_rerun(
    run_id: uuid.UUID,
    *,
    rerun_of: uuid.UUID,
    from_step: str | None,
    step_index: int,
    context: dict[str, Any],
    state: dict[str, Any],
) -> None:
    """Make the run a start just inserted (in the caller's transaction, so no worker
    has claimed it) a rerun of ``rerun_of`` beginning at ``step_index``."""
    Run.objects.filter(id=run_id).update(
        rerun_of_id=rerun_of,
        rerun_from_step=from_step,
        step_index=step_index,
        context=context,
        state=state,
    )


def began_steps(run_id: uuid.UUID) -> set[int]:
    """The indexes of the steps the run began (it has an attempt of them)."""
    return set(
        StepAttempt.objects.filter(run_id=run_id, kind=StepAttempt.Kind.STEP)
        .values_list("step_index", flat=True)
        .distinct()
    )


def replaced_values(run_id: uuid.UUID) -> tuple[dict[int, dict], list[dict]]:
    """What the run's completed attempts replaced in its context
    (``StepAttempt.replaced``): each step's, by step index, and each compensation's,
    oldest first; one query, through the index of the attempts' run."""
    steps: dict[int, dict] = {}
    compensations: list[dict] = []
    rows = (
        StepAttempt.objects.filter(
            run_id=run_id, status=StepAttempt.Outcome.COMPLETED, replaced__isnull=False
        )
        .order_by("id")
        .values_list("kind", "step_index", "replaced")
    )
    for kind, index, replaced in rows:
        if kind == StepAttempt.Kind.STEP:
            steps[index] = replaced
        else:
            compensations.append(replaced)
    return steps, compensations


def reruns_of(run_ids: list[uuid.UUID], from_step: str | None = None) -> QuerySet[Run]:
    """The reruns of these runs (of ``from_step``, when given), newest first."""
    runs = Run.objects.filter(rerun_of_id__in=run_ids)
    if from_step is not None:
        runs = runs.filter(rerun_from_step=from_step)
    return runs.order_by("-created_at", "-id")


def rerun_already(run_ids: list[uuid.UUID], from_step: str | None) -> dict[uuid.UUID, uuid.UUID]:
    """Of these runs, those rerun from ``from_step`` already (None: from the first
    step), each with its newest such rerun; one statement."""
    runs = Run.objects.filter(rerun_of_id__in=run_ids)
    if from_step is None:
        runs = runs.filter(rerun_from_step__isnull=True)
    else:
        runs = runs.filter(rerun_from_step=from_step)
    found: dict[uuid.UUID, uuid.UUID] = {}
    for original, rerun in runs.order_by("created_at", "id").values_list("rerun_of_id", "id"):
        found[original] = rerun  # the newest last
    return found
