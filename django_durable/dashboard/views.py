"""The dashboard's reading pages: overview, keys, runs, a run, a workflow.

Every view is ``view(request, run_admin, ...)``, served through
``site.guard`` (the admin site's login and chrome, ``view_run``, no framing).
Each page has one live part that htmx polls; the poll answers 204 while it is
unchanged. Queries are bounded: pages of 50 without a count, counts bounded or
estimated (``counts``), and no query grows with the runs table.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib import messages
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.utils.timezone import localtime, now

from django_durable import query
from django_durable.dashboard import (
    actions,
    charts,
    counts,
    keystats,
    keyview,
    natural,
    rerun,
    search,
    streams,
    timeline,
    values,
    workers,
)
from django_durable.dashboard.filters import KeyFilter, RunFilter
from django_durable.dashboard.paging import page_of
from django_durable.dashboard.site import render_page
from django_durable.models import Run, StepAttempt
from django_durable.operations import flow_holds, flow_reports
from django_durable.workflows.definition import registry
from django_durable.workflows.flow import flow_limits

LIST_FIELDS_DEFERRED = ("input", "context", "result", "state")
SORTS = {
    "-created": ("-created_at", "-id"),
    "created": ("created_at", "id"),
}


def overview(request, run_admin):
    status_counts, counted = counts.status_counts()
    alive = workers.live_workers()
    context = {
        "status_counts": status_counts,
        "counted": counted,
        "key_stats": keystats.summary(),
        "activity": query.recent_activity(20),
        "recent_runs": _listed(Run.objects.order_by("-created_at", "-id"), 10),
        "workflows": sorted(w.name for w in registry.all()),
        "unserved": workers.unserved_queues(alive),
        "unknown": workers.unknown_workflows(alive),
        "throughput": charts.throughput(),
    }
    _add_bars(context["key_stats"])
    return render_page(
        request,
        run_admin,
        "django_durable/overview.html",
        "Durable workflows",
        context,
        live="django_durable/_overview_live.html",
    )


def _add_bars(key_stats: dict) -> None:
    """Heights (percent) for the re-adds over time bars."""
    buckets = key_stats["readds_over_time"]
    top = max((b["count"] for b in buckets), default=0) or 1
    for bucket in buckets:
        bucket["percent"] = round(100 * bucket["count"] / top)


def _listed(runs, limit: int | None = None) -> list[Run]:
    """Runs for a list: without their big values, with a step count."""
    runs = runs.defer(*LIST_FIELDS_DEFERRED)
    return _decorate(list(runs[:limit] if limit else runs))


def _decorate(rows: list[Run]) -> list[Run]:
    """What the run rows show besides the fields: step N of M, the error's
    headline, the times in the current timezone, how long a finished run took.

    The times are formatted here (``strftime``) rather than by the ``date``
    filter: six dates a row are most of the time a list of 50 runs takes."""
    for run in rows:
        definition = _definition(run.workflow)
        run.step_total = len(definition.steps) if definition else None
        run.step_number = run.step_index + 1
        run.error_headline = _headline(run.error)
        run.short_id = str(run.id)[:8]  # the whole id in the link's title
        run.created = When.of(run.created_at)
        run.finished = When.of(run.finished_at) if run.finished_at else None
        ended, began = run.finished_at, run.started_at or run.created_at
        run.duration = timeline.human_duration(ended - began) if ended else ""
    return rows


@dataclass(frozen=True)
class When:
    """A time as the rows show it, in the current timezone."""

    iso: str
    day: str  # the date and the clock apart: a narrow column breaks between them
    clock: str
    title: str

    @classmethod
    def of(cls, at: datetime) -> When:
        local = localtime(at)
        day, clock = local.strftime("%Y-%m-%d"), local.strftime("%H:%M:%S")
        return cls(local.isoformat(), day, clock, f"{day} {clock} {local.strftime('%Z')}")


def _headline(error) -> str:
    if not error:
        return ""
    if not isinstance(error, dict):
        return str(error)[:200]
    return f"{error.get('type', 'Error')}: {str(error.get('message', ''))[:200]}"


def keys(request, run_admin):
    filters = KeyFilter(request.GET or None, queryset=query.keyed_runs())
    if filters.is_bound and not filters.is_valid():
        runs = query.keyed_runs().none()
    else:
        runs = filters.qs if filters.is_bound else query.keyed_runs()
    page = page_of(query.group_keys(runs), request)
    page.items = natural.sorted_keys(query.describe_keys(page.items))
    context = {"filters": filters, "page": page, "query_string": _query_without_page(request)}
    return render_page(
        request,
        run_admin,
        "django_durable/keys.html",
        "Keys",
        context,
        live="django_durable/_keys_table.html",
    )


def matching_runs(params):
    """The runs the search and filters in ``params`` (a QueryDict) select, in the
    chosen order, with the messages to show above them (errors select nothing)."""
    order = SORTS.get(params.get("o", "-created"), SORTS["-created"])
    base = Run.objects.defer(*LIST_FIELDS_DEFERRED).order_by(*order)
    params = params.copy()
    for name in ("page", "_seen", "o"):
        params.pop(name, None)
    filters = RunFilter(params or None, queryset=base)
    problems: list[str] = []
    if filters.is_bound and not filters.is_valid():
        for name, errors in filters.errors.items():
            problems.extend(f"{name}: {e}" for e in errors)
        runs = base.none()
    else:
        runs = filters.qs if filters.is_bound else base
    parsed = getattr(filters, "search", None)
    notes = []
    if parsed is not None:
        problems.extend(parsed.errors)
        notes.extend(parsed.notes)
    return filters, runs, problems, notes


def runs(request, run_admin):
    cut = search.cut_search_url(request)
    if cut is not None:
        messages.warning(request, search.cut_message())
        return HttpResponseRedirect(cut)
    filters, selected, problems, notes = matching_runs(request.GET)
    sort = request.GET.get("o") if request.GET.get("o") in SORTS else "-created"
    page = page_of(selected, request)
    page.items = _decorate(page.items)
    streams.add_progress(page.items)
    if page.clamped:
        notes.append(f"Pages go up to {page.number}; this is the last one shown.")
    context = {
        "filters": filters,
        "page": page,
        "search_errors": problems,
        "search_notes": notes,
        "query_string": _query_without_page(request),
        "sort": sort,
        "sort_toggle": _with(request, o="created" if sort == "-created" else "-created"),
    }
    return render_page(
        request,
        run_admin,
        "django_durable/runs.html",
        "Runs",
        context,
        live="django_durable/_runs_table.html",
    )


def run(request, run_admin, run_id):
    try:
        found, shown = values.load_run(run_id)
    except Run.DoesNotExist:
        raise Http404(f"no run {run_id}") from None
    seen_status = request.GET.get("_status")
    if seen_status and seen_status != found.status:
        # The run moved on (failed, finished): the whole page changes, errors and all.
        response = HttpResponse(status=204)
        response["HX-Refresh"] = "true"
        return response
    definition = _definition(found.workflow)
    step_names = [s.name for s in definition.steps] if definition else []
    attempts = list(StepAttempt.objects.filter(run=found).defer("output").order_by("id"))
    children = _listed(Run.objects.filter(parent=found).order_by("created_at"), 50)
    key_view = keyview.build(found)
    if key_view is not None:
        _decorate(key_view.runs)
    at = now()
    context = {
        "run": found,
        "step_total": len(step_names),
        "step_number": min(found.step_index + 1, len(step_names)) if step_names else None,
        "all_steps_done": bool(step_names) and found.step_index >= len(step_names),
        "attempts": attempts,
        "failed_attempts": [a for a in attempts if a.error],
        "logged_attempts": [a for a in attempts if getattr(a, "logs", None)],
        "events": values.events_of(found),
        "values": shown,
        "error": _describe_error(found.error),
        "key_view": key_view,
        "children": children,
        "offers": actions.offers(found),
        "unknown_workflow": workers.unknown_to_live_workers(found),
        "now_sentence": flow_reports.describe(found),  # what it does or waits for
        "replay": rerun.replay_of(found),  # dashboard/rerun.py
        "timeline": timeline.build(found, attempts, at),
        "graph": timeline.graph(step_names, attempts, children, found),
        "elapsed": timeline.human_duration(
            (found.finished_at or at) - (found.started_at or found.created_at)
        ),
        **streams.run_streams(found),  # progress and streams (dashboard/streams.py)
    }
    for attempt in attempts:
        attempt.duration = timeline.human_duration((attempt.finished_at or at) - attempt.started_at)
    return render_page(
        request,
        run_admin,
        "django_durable/run.html",
        f"Run {found.id}",
        context,
        live="django_durable/_run_live.html",
    )


def _describe_error(error) -> dict | None:
    """A run's error as a headline, its other fields, and the traceback apart."""
    if error is None:
        return None
    if not isinstance(error, dict):
        return {"headline": str(error)[:2000], "extra": None, "traceback": None}
    rest = {k: v for k, v in error.items() if k not in ("type", "message", "traceback")}
    message = str(error.get("message", ""))
    return {
        "headline": f"{error.get('type', 'Error')}: {message[:2000]}",
        "extra": keyview.pretty(rest)[:20_000] if rest else None,
        "traceback": str(error.get("traceback") or "")[: values.SHOWN] or None,
    }


def _definition(name: str):
    try:
        return registry.get(name)
    except LookupError:
        return None


def workflow(request, run_admin, name):
    definition = _definition(name)
    status_counts, counted = counts.status_counts(name)
    if definition is None and not any(n.value for _, n in status_counts):
        raise Http404(f"no workflow is named {name!r}")
    key_rows = natural.sorted_keys(query.describe_keys(query.keys_queryset(name)[:20]))
    context = {
        "name": name,
        "definition": definition,
        "class_path": f"{definition.__module__}.{definition.__qualname__}" if definition else "",
        "steps": [s.name for s in definition.steps] if definition else [],
        "schedules": getattr(definition, "schedules", []) if definition else [],
        "status_counts": status_counts,
        "counted": counted,
        "key_stats": keystats.summary(name),
        "key_rows": key_rows,
        "recent_runs": _listed(query.runs_of(name), 10),
        "retention": rerun.retention_rows(definition) if definition else [],
        "flow": _flow_keys(definition),
    }
    _add_bars(context["key_stats"])
    return render_page(
        request,
        run_admin,
        "django_durable/workflow.html",
        f"Workflow {name}",
        context,
        live="django_durable/_workflow_live.html",
    )


# How many flow keys the workflow page lists (most due first); the command line all.
FLOW_KEYS_SHOWN = 50


def _flow_keys(definition) -> dict | None:
    """The workflow's flow keys (``flow_stats``), when it declares flow control."""
    if definition is None or (definition.flow_key is None and flow_limits(definition) is None):
        return None
    rows = flow_reports.flow_stats(definition, limit=FLOW_KEYS_SHOWN + 1)
    shown = rows[:FLOW_KEYS_SHOWN]
    for row, start in zip(shown, flow_holds.next_starts(definition, shown), strict=True):
        row["next_start"] = start
    return {
        "rows": shown,
        "more": len(rows) > FLOW_KEYS_SHOWN,
        "declared": flow_reports.declared_text(definition),
    }


def _with(request, **params) -> str:
    """This page's URL with ``params`` set (and the page number dropped)."""
    query = request.GET.copy()
    for name in ("page", "_seen", "_status", *params):
        query.pop(name, None)
    query.update(params)
    return f"{request.path}?{query.urlencode()}"


def _query_without_page(request) -> str:
    params = request.GET.copy()
    for name in ("page", "_seen", "_status"):
        params.pop(name, None)
    return params.urlencode()
