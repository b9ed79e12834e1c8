"""Bulk actions on the runs list: retry, cancel or rerun the selected runs, or
every run the current search matches.

The first POST (from the runs list) shows one confirmation with the number of
runs; the confirmed POST acts on each run through the public API, in the order
of the list, and answers with each run's outcome (done, or refused and why).
Runs acted on are recorded in the admin history, one ``LogEntry`` each. At most
``MAX_RUNS`` runs at once: a search matching more must be narrowed first.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.http import Http404, QueryDict
from django.shortcuts import render
from django.views.decorators.http import require_POST

from django_durable.dashboard import actions, audit, rerun
from django_durable.dashboard.counts import bounded
from django_durable.exceptions import DurableError
from django_durable.models import Run

MAX_RUNS = 10_000
SLUGS = ("retry", "cancel", "rerun", rerun.BULK_SLUG)
SEARCH_FIELDS = ("q", "workflow", "status", "queue", "created_after", "created_before", "o")


@dataclass
class Outcome:
    run_id: uuid.UUID
    done: bool
    message: str


def _selected_ids(post) -> list[uuid.UUID]:
    ids = []
    for raw in post.getlist("ids")[:MAX_RUNS]:
        try:
            ids.append(uuid.UUID(raw))
        except ValueError:
            continue
    return ids


def _search_of(post) -> QueryDict:
    params = QueryDict(mutable=True)
    for name in SEARCH_FIELDS:
        if post.get(name):
            params[name] = post[name]
    return params


@require_POST
def bulk_action(request, run_admin, matching_runs):
    slug = request.POST.get("action", "")
    if slug not in SLUGS:
        raise Http404(f"no bulk action {slug!r}")
    action = actions.ACTIONS.get(slug, rerun.BULK_ACTION)
    every = request.POST.get("scope") == "all"
    search = _search_of(request.POST)
    if every:
        _filters, runs, problems, _notes = matching_runs(search)
        count = bounded(runs, MAX_RUNS)
    else:
        ids = _selected_ids(request.POST)
        runs = Run.objects.filter(id__in=ids).defer("input", "context", "result", "state")
        problems, count = [], bounded(runs, MAX_RUNS)
    context = {
        **run_admin.admin_site.each_context(request),
        "title": f"{action.label} {count} runs?",
        "action": action,
        "count": count,
        "every": every,
        "search": search,
        "ids": [] if every else [str(i) for i in _selected_ids(request.POST)],
        "problems": problems,
        "too_many": count.more,
    }
    if slug == rerun.BULK_SLUG:  # a choice of step first (dashboard/rerun.py)
        return rerun.bulk(request, runs, context)
    if request.POST.get("confirm") != "yes" or count.more or problems or not count.value:
        return render(request, "django_durable/bulk_confirm.html", context)
    reason = actions.reason_of(request)
    outcomes = [_act(slug, run, request.user, reason) for run in runs.order_by()[:MAX_RUNS]]
    done = [o.run_id for o in outcomes if o.done]
    audit.log_runs(request.user, done, action.label, reason)
    context.update(
        title=f"{action.label}: {len(done)} of {len(outcomes)} runs",
        outcomes=outcomes,
        done=len(done),
    )
    return render(request, "django_durable/bulk_done.html", context)


def _act(slug: str, run: Run, user, reason: str | None) -> Outcome:
    refused = actions.refusal(slug, run)
    if refused:
        return Outcome(run.id, False, f"refused: {refused}")
    try:
        message, _shown = actions.perform(slug, run, user, reason)
    except DurableError as exc:
        return Outcome(run.id, False, f"refused: {type(exc).__name__}: {exc}")
    return Outcome(run.id, True, message)
