"""The dashboard's actions on a run: retry, rerun, cancel, release its key.

Each is a GET that shows a confirmation and a POST (with Django's CSRF check)
that calls the public operation. A refusal (``KeyTaken``, ``NotFinished``...)
comes back as a message on the run page saying why. Acting needs staff status
and the ``django_durable.change_run`` permission.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

import django_durable as durable
from django_durable.dashboard.views import staff_required
from django_durable.exceptions import DurableError
from django_durable.models import Run


@dataclass(frozen=True)
class Action:
    slug: str
    label: str
    explanation: str


ACTIONS = {
    a.slug: a
    for a in (
        Action(
            "retry",
            "Retry",
            "The run resumes at the step that failed and takes its key "
            "back if no newer run holds it.",
        ),
        Action(
            "rerun",
            "Rerun",
            "A new run starts with the same workflow, input and key. "
            "It is refused while another run holds the key.",
        ),
        Action(
            "cancel",
            "Cancel",
            "The run stops: a running step stops at its next heartbeat "
            "and no later step runs. It keeps its key.",
        ),
        Action(
            "release-key",
            "Release key",
            "The finished run lets its key go, so the next "
            "start with this key creates a new run. You are recorded as who released it.",
        ),
    )
}


def _perform(slug: str, run: Run, request) -> tuple[str, str]:
    """Call the operation; return (message, run id to show next)."""
    if slug == "retry":
        durable.retry(run.id)
        return f"Run {run.id} will be retried.", str(run.id)
    if slug == "rerun":
        new_id = durable.rerun(run.id)
        return f"Run {run.id} was started again as run {new_id}.", str(new_id)
    if slug == "cancel":
        reason = request.POST.get("reason", "").strip()[:500] or None
        by = request.user.get_username()
        durable.cancel(run.id, reason=reason or f"cancelled by {by} in the dashboard")
        return f"Run {run.id} was cancelled.", str(run.id)
    if slug == "release-key":
        durable.release_key(run.id, by=request.user.get_username())
        return f"Key {run.key!r} of run {run.id} was released.", str(run.id)
    raise Http404(f"no action {slug!r}")


@staff_required
@require_http_methods(["GET", "POST"])
def run_action(request, run_id, action):
    chosen = ACTIONS.get(action)
    if chosen is None:
        raise Http404(f"no action {action!r}")
    try:
        run = durable.get_run(run_id)
    except Run.DoesNotExist:
        raise Http404(f"no run {run_id}") from None
    if not request.user.has_perm("django_durable.change_run"):
        raise PermissionDenied("acting on runs needs the django_durable.change_run permission")
    run_url = reverse("django_durable:run", args=[run.id])
    if request.method == "POST":
        try:
            message, shown = _perform(action, run, request)
        except DurableError as exc:
            messages.error(request, f"{chosen.label} refused: {type(exc).__name__}: {exc}")
            return HttpResponseRedirect(run_url)
        messages.success(request, message)
        return HttpResponseRedirect(reverse("django_durable:run", args=[shown]))
    context = {
        **admin.site.each_context(request),
        "title": f"{chosen.label} run {run.id}?",
        "run": run,
        "action": chosen,
    }
    return render(request, "django_durable/confirm.html", context)
