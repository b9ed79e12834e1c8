"""What happened to keys: ``django_durable.activity.list(...)``."""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Iterable
from datetime import datetime

from django_durable.models import Activity

KINDS = tuple(Activity.Kind.values)


def list(  # noqa: A001 - the public name is activity.list
    kinds: Iterable[str] | None = None,
    run_id: uuid.UUID | str | None = None,
    since: datetime | None = None,
) -> builtins.list[Activity]:
    """Activity rows, newest first, of the given ``kinds``, for ``run_id``, since ``since``."""
    rows = Activity.objects.all()
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else builtins.list(kinds)
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown activity kinds {sorted(unknown)}; kinds are {KINDS}")
        rows = rows.filter(kind__in=kinds)
    if run_id is not None:
        rows = rows.filter(run_id=run_id)
    if since is not None:
        rows = rows.filter(created_at__gte=since)
    return builtins.list(rows.order_by("-created_at", "-id"))
