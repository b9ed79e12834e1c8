"""The dashboard: overview, keys, runs, a run (with its Key view), a workflow.

Pages are staff only and render inside the admin (its base template and
``admin.site.each_context``). Lists refresh themselves with htmx: an htmx
request gets the list partial, any other request the full page. The views only
read; the actions (``actions.py``) go through the public operations.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from django.contrib import admin
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import render
from django.urls import reverse

import django_durable as durable
from django_durable import query, stats
from django_durable.dashboard import keyview
from django_durable.dashboard.filters import KeyFilter, RunFilter
from django_durable.dashboard.keyview import pretty
from django_durable.models import (
    ACTIVE_STATUSES,
    FINISHED_STATUSES,
    Event,
    Run,
    Status,
    StepAttempt,
)
from django_durable.workflows.definition import registry

PER_PAGE = 50
REFRESH_SECONDS = 5


def staff_required(view):
    """Anonymous users go to the admin login; signed-in users who aren't staff get 403."""

    @functools.wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path(), reverse("admin:login"))
        if not (request.user.is_active and request.user.is_staff):
            raise PermissionDenied("the durable workflows dashboard is for staff only")
        return view(request, *args, **kwargs)

    return wrapped


@dataclass
class Page:
    """A page of a list without counting the whole list: a count of a table of
    millions of runs would cost more than the page itself."""

    items: list
    number: int
    has_next: bool

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def next_number(self) -> int:
        return self.number + 1

    @property
    def previous_number(self) -> int:
        return self.number - 1


def page_of(queryset, request, per_page: int = PER_PAGE) -> Page:
    try:
        number = max(1, int(request.GET.get("page", 1)))
    except ValueError:
        number = 1
    start = (number - 1) * per_page
    items = list(queryset[start : start + per_page + 1])
    return Page(items[:per_page], number, len(items) > per_page)


def _render(request, template: str, partial: str, title: str, context: dict):
    """The partial for htmx requests (polling), the full page otherwise."""
    context = {
        **admin.site.each_context(request),
        "title": title,
        "partial_template": partial,
        "refresh_seconds": REFRESH_SECONDS,
        **context,
    }
    if request.htmx:
        return render(request, partial, context)
    return render(request, template, context)


def _query_without_page(request) -> str:
    params = request.GET.copy()
    params.pop("page", None)
    return params.urlencode()


@staff_required
def overview(request):
    counts = query.status_counts()
    context = {
        "status_counts": [(s.value, counts.get(s.value, 0)) for s in Status],
        "total_runs": sum(counts.values()),
        "key_stats": stats.keys(),
        "activity": query.recent_activity(20),
        "recent_runs": list(Run.objects.order_by("-created_at", "-id")[:10]),
        # The defined workflows: listing the names found in a big runs table would
        # scan it on every refresh.
        "workflows": sorted(w.name for w in registry.all()),
    }
    _add_bars(context["key_stats"])
    return _render(
        request,
        "django_durable/overview.html",
        "django_durable/_overview_live.html",
        "Durable workflows",
        context,
    )


def _add_bars(key_stats: dict) -> None:
    """Heights (percent) for the re-adds over time bars."""
    buckets = key_stats["readds_over_time"]
    top = max((b["count"] for b in buckets), default=0) or 1
    for bucket in buckets:
        bucket["percent"] = round(100 * bucket["count"] / top)


@staff_required
def keys(request):
    filters = KeyFilter(request.GET or None, queryset=query.keyed_runs())
    runs = filters.qs if filters.is_bound and filters.is_valid() else query.keyed_runs()
    page = page_of(query.group_keys(runs), request)
    page.items = query.describe_keys(page.items)
    context = {"filters": filters, "page": page, "query_string": _query_without_page(request)}
    return _render(
        request, "django_durable/keys.html", "django_durable/_keys_table.html", "Keys", context
    )


@staff_required
def runs(request):
    base = Run.objects.order_by("-created_at", "-id")
    filters = RunFilter(request.GET or None, queryset=base)
    runs = filters.qs if filters.is_bound and filters.is_valid() else base
    page = page_of(runs, request)
    context = {
        "filters": filters,
        "page": page,
        "search_errors": getattr(filters, "search_errors", []),
        "query_string": _query_without_page(request),
    }
    return _render(
        request, "django_durable/runs.html", "django_durable/_runs_table.html", "Runs", context
    )


@staff_required
def run(request, run_id):
    try:
        found = durable.get_run(run_id)
    except Run.DoesNotExist:
        raise Http404(f"no run {run_id}") from None
    definition = _definition(found.workflow)
    steps = [s.name for s in definition.steps] if definition else []
    attempts = list(StepAttempt.objects.filter(run=found).order_by("id"))
    context = {
        "run": found,
        "steps": [
            {
                "index": i,
                "name": name,
                "state": "done"
                if i < found.step_index
                else ("current" if i == found.step_index else "later"),
            }
            for i, name in enumerate(steps)
        ],
        "attempts": attempts,
        "failed_attempts": [a for a in attempts if a.error],
        "events": list(Event.objects.filter(run=found).order_by("id")),
        "input_json": pretty(found.input),
        "context_json": pretty(found.context),
        "result_json": pretty(found.result) if found.result is not None else None,
        "error": _describe_error(found.error),
        "key_view": keyview.build(found),
        "children": list(Run.objects.filter(parent=found).order_by("created_at")[:50]),
        "can_retry": found.status == Status.FAILED,
        "can_rerun": found.status in FINISHED_STATUSES,
        "can_cancel": found.status in ACTIVE_STATUSES and found.status != Status.COMPENSATING,
        "can_release": found.status in FINISHED_STATUSES and found.holds_key,
    }
    return _render(
        request,
        "django_durable/run.html",
        "django_durable/_run_live.html",
        f"Run {found.id}",
        context,
    )


def _describe_error(error) -> dict | None:
    """A run's error as a headline, its other fields, and the traceback apart."""
    if error is None:
        return None
    if not isinstance(error, dict):
        return {"headline": str(error), "extra": None, "traceback": None}
    rest = {k: v for k, v in error.items() if k not in ("type", "message", "traceback")}
    return {
        "headline": f"{error.get('type', 'Error')}: {error.get('message', '')}",
        "extra": pretty(rest) if rest else None,
        "traceback": error.get("traceback"),
    }


def _definition(name: str):
    try:
        return registry.get(name)
    except LookupError:
        return None


@staff_required
def workflow(request, name):
    definition = _definition(name)
    counts = query.status_counts(name)
    if definition is None and not counts:
        raise Http404(f"no workflow is named {name!r}")
    key_rows = query.describe_keys(query.keys_queryset(name)[:20])
    context = {
        "name": name,
        "definition": definition,
        "class_path": f"{definition.__module__}.{definition.__qualname__}" if definition else "",
        "steps": [s.name for s in definition.steps] if definition else [],
        "schedules": getattr(definition, "schedules", []) if definition else [],
        "status_counts": [(s.value, counts.get(s.value, 0)) for s in Status],
        "key_stats": stats.keys(workflow=name),
        "key_rows": key_rows,
        "recent_runs": list(query.runs_of(name)[:10]),
    }
    _add_bars(context["key_stats"])
    return _render(
        request,
        "django_durable/workflow.html",
        "django_durable/_workflow_live.html",
        f"Workflow {name}",
        context,
    )
