"""The queues page: each queue's due runs (those a worker may claim now apart from
those flow limits hold back, ``operations.flow_holds``), running and waiting runs,
its concurrency limit, whether it is paused and how long its oldest due run has waited; and the
Pause and Resume buttons.

The rows are ``queue_rows()`` (``durable.queue_stats()`` and the queues named in
settings, by the defined workflows and by the newest runs): a fixed number of
queries whatever the number of queues or runs, and one read of the queues an
operator acted on (``durable_queue``, a row per queue ever paused). Pause and Resume are, like the
run actions (``actions.py``), a GET that shows a confirmation and a POST
(CSRF-checked by the admin site, ``django_durable.change_run`` needed) that calls
``durable.pause_queue`` / ``durable.resume_queue`` and writes a ``LogEntry`` on the
queue's row with the user and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import render
from django.urls import NoReverseMatch, reverse

import django_durable as durable
from django_durable import conf
from django_durable.dashboard import audit, timeline
from django_durable.dashboard.actions import reason_of
from django_durable.dashboard.site import render_page
from django_durable.models import QueueState, Run
from django_durable.operations import flow_holds
from django_durable.operations.queues import queue_stats
from django_durable.workflows.definition import registry

# How many of the newest runs ``queue_rows()`` reads for the names of queues whose
# runs all finished (one range of the created_at index).
RECENT_RUNS = 1000


def queue_rows(recent: int = RECENT_RUNS) -> list[dict[str, Any]]:
    """Every queue an operator may look for, by name: ``queue_stats()``'s rows (queues
    with active runs, paused and configured ones) and, counted as empty, the queues
    named in ``DURABLE["QUEUES"]``, of the defined workflows and of the ``recent``
    newest runs. Three queries, whatever the number of queues."""
    rows = queue_stats()
    listed = {row["queue"] for row in rows}
    newest = Run.objects.order_by("-created_at").values_list("queue", flat=True)[:recent]
    named = set(conf.get("QUEUES") or {}) | {w.queue for w in registry.all()} | set(newest)
    limits = conf.queue_limits()
    rows += [
        {
            "queue": name,
            "paused": False,
            "pending": 0,
            "due": 0,
            "running": 0,
            "waiting": 0,
            "oldest_due_seconds": None,
            "concurrency": limits.get(name),
        }
        for name in named - listed
    ]
    return sorted(rows, key=lambda row: row["queue"])


@dataclass(frozen=True)
class QueueAction:
    slug: str
    label: str
    logged: str  # the admin history's words
    explanation: str


ACTIONS = {
    a.slug: a
    for a in (
        QueueAction(
            "pause",
            "Pause",
            "Paused queue",
            "No worker claims the queue's runs until it is resumed: runs already "
            "running finish, new runs are still accepted and wait, due.",
        ),
        QueueAction(
            "resume",
            "Resume",
            "Resumed queue",
            "Workers claim the queue's due runs again, at once.",
        ),
    )
}


def _shown(row: dict, acted: set[str], held: dict[str, dict[str, int]] | None = None) -> dict:
    """A row of ``queue_stats`` with what the page shows besides its numbers: its due
    runs that flow limits hold back (``held``, by workflow, linked to the workflow's
    flow keys) apart from those a worker may claim now, and a link to its history
    when an operator ever paused or resumed it (``acted``)."""
    oldest = row["oldest_due_seconds"]
    by_workflow = sorted((held or {}).get(row["queue"], {}).items())
    held_total = sum(n for _, n in by_workflow)
    return {
        **row,
        "held": [
            (name, n, reverse("django_durable:workflow", args=[name]) + "#flow-keys")
            for name, n in by_workflow
        ],
        "held_total": held_total,
        "claimable": max(row["due"] - held_total, 0),
        "oldest_due": timeline.human_duration(timedelta(seconds=oldest))
        if oldest is not None
        else "",
        "history_url": _history_url(row["queue"]) if row["queue"] in acted else "",
    }


def _history_url(name: str) -> str:
    try:
        return reverse("admin:django_durable_queuestate_history", args=[name])
    except NoReverseMatch:  # a project whose admin site does not register queues
        return ""


def queues_page(request, run_admin):
    acted = set(QueueState.objects.values_list("name", flat=True))  # a handful of rows
    held = flow_holds.held_by_queue()
    context = {"queues": [_shown(row, acted, held) for row in queue_rows()]}
    return render_page(
        request,
        run_admin,
        "django_durable/queues.html",
        "Queues",
        context,
        live="django_durable/_queues_live.html",
    )


def queue_action(request, run_admin, name, action):
    chosen = ACTIONS.get(action)
    if chosen is None:
        raise Http404(f"no action {action!r}")
    try:
        row = durable.queue_stats(name)[0]
    except ValueError as exc:  # not a queue name (empty, longer than 100 characters)
        raise Http404(str(exc)) from None
    back = reverse("django_durable:queues")
    if request.method == "POST":
        reason = reason_of(request)
        if action == "pause":
            durable.pause_queue(name)
            messages.success(request, f"Queue {name} is paused: its runs are not claimed.")
        else:
            durable.resume_queue(name)
            messages.success(request, f"Queue {name} is resumed: its due runs are claimed.")
        audit.log_queue(request.user, name, chosen.logged, reason)
        return HttpResponseRedirect(back)
    unchanged = row["paused"] == (action == "pause")
    context = {
        **run_admin.admin_site.each_context(request),
        "title": f"{chosen.label} queue {name}?",
        "queue": _shown(row, set()),
        "action": chosen,
        "unchanged": unchanged,
    }
    return render(request, "django_durable/queue_confirm.html", context)
