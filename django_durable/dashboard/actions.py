"""The dashboard's actions on one run: retry, rerun, cancel, release its key.

Each is a GET that shows a confirmation and a POST (CSRF-checked by the admin
site) that calls the public operation (``import django_durable as durable``)
and writes a ``LogEntry`` with the user and the reason. Acting needs
``django_durable.change_run``.

``offers()`` says before anything is clicked which actions the key rules will
refuse, and why: the page shows those buttons disabled with the reason, and a
POST of one is answered with that reason without calling the operation, so a
refused Rerun never writes a producer's ``key_duplicate`` activity.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import messages
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

import django_durable as durable
from django_durable.dashboard import audit
from django_durable.exceptions import DurableError
from django_durable.models import ACTIVE_STATUSES, FINISHED_STATUSES, Run, Status
from django_durable.operations.keys import retake_allowed, reuse_frees
from django_durable.workflows.definition import registry

REASON_LENGTH = 500


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


@dataclass(frozen=True)
class Offer:
    action: Action
    allowed: bool
    hint: str = ""


def _holder(run: Run) -> Run | None:
    if run.key is None or run.holds_key:
        return run if run.holds_key else None
    return (
        Run.objects.filter(workflow=run.workflow, key=run.key, holds_key=True)
        .only("id", "status")
        .first()
    )


def _reuse(run: Run) -> str | None:
    try:
        return registry.get(run.workflow).reuse
    except LookupError:
        return None


def refusal(slug: str, run: Run, holder: Run | None = None, *, looked_up: bool = False) -> str:
    """Why ``slug`` would be refused on ``run`` now ("" when it would be done)."""
    if slug in ("retry", "rerun") and _reuse(run) is None:
        return f"No workflow named {run.workflow!r} is deployed."
    holder = holder if looked_up else _holder(run)
    if slug == "retry":
        if run.status != Status.FAILED:
            return f"Only a failed run can be retried; this one is {run.status}."
        other = holder is not None and holder.id != run.id
        if other and not retake_allowed(_reuse(run), holder.status):
            return f"Run {holder.id} ({holder.status}) holds the key and keeps it."
        return ""
    if slug == "rerun":
        if run.status not in FINISHED_STATUSES:
            return f"Only a finished run can be rerun; this one is {run.status}."
        if holder is None:
            return ""
        if holder.status in ACTIVE_STATUSES:
            return f"Run {holder.id} ({holder.status}) holds the key."
        if not reuse_frees(_reuse(run), holder.status):
            who = "this run" if holder.id == run.id else f"run {holder.id}"
            return (
                f"The key is held by {who} ({holder.status}) and reuse={_reuse(run)!r} "
                "keeps it: release the key first."
            )
        return ""
    if slug == "cancel":
        if run.status == Status.COMPENSATING:
            return "A compensating run cannot be cancelled: its compensations run to the end."
        if run.status not in ACTIVE_STATUSES:
            return f"The run already finished ({run.status})."
        return ""
    if slug == "release-key":
        if run.status in ACTIVE_STATUSES:
            return "The run is still going: cancel it before releasing its key."
        if not run.holds_key:
            return "The run holds no key."
        return ""
    raise Http404(f"no action {slug!r}")


def offers(run: Run) -> list[Offer]:
    """The buttons of the run page: what may be done now, and what would be refused."""
    holder = _holder(run)
    shown = []
    for slug, action in ACTIONS.items():
        reason = refusal(slug, run, holder, looked_up=True)
        if slug == "cancel" and run.status in FINISHED_STATUSES:
            continue  # nothing to offer, nothing to explain
        if slug == "retry" and run.status != Status.FAILED:
            continue
        if slug == "rerun" and run.status not in FINISHED_STATUSES:
            continue
        if slug == "release-key" and not run.holds_key:
            continue
        shown.append(Offer(action, not reason, reason))
    return shown


def perform(slug: str, run: Run, user, reason: str | None) -> tuple[str, Run | str]:
    """Call the public operation; return (message, run id to show next)."""
    by = user.get_username()
    if slug == "retry":
        durable.retry(run.id)
        return f"Run {run.id} will be retried.", str(run.id)
    if slug == "rerun":
        new_id = durable.rerun(run.id)
        return f"Run {run.id} was started again as run {new_id}.", str(new_id)
    if slug == "cancel":
        text = f"cancelled by {by} in the dashboard"
        durable.cancel(run.id, reason=f"{reason} ({text})" if reason else text)
        return f"Run {run.id} was cancelled.", str(run.id)
    if slug == "release-key":
        durable.release_key(run.id, by=by)
        return f"Key {run.key!r} of run {run.id} was released.", str(run.id)
    raise Http404(f"no action {slug!r}")


def reason_of(request) -> str | None:
    return request.POST.get("reason", "").strip()[:REASON_LENGTH] or None


def run_action(request, run_admin, run_id, action):
    chosen = ACTIONS.get(action)
    if chosen is None:
        raise Http404(f"no action {action!r}")
    try:
        run = Run.objects.defer("input", "context", "result", "state").get(id=run_id)
    except Run.DoesNotExist:
        raise Http404(f"no run {run_id}") from None
    run_url = reverse("django_durable:run", args=[run.id])
    refused = refusal(action, run)
    if request.method == "POST":
        if refused:
            messages.error(request, f"{chosen.label} refused: {refused}")
            return HttpResponseRedirect(run_url)
        reason = reason_of(request)
        try:
            message, shown = perform(action, run, request.user, reason)
        except DurableError as exc:
            messages.error(request, f"{chosen.label} refused: {type(exc).__name__}: {exc}")
            return HttpResponseRedirect(run_url)
        audit.log_runs(request.user, [run.id], chosen.label, reason)
        if shown != str(run.id):
            audit.log_runs(request.user, [shown], f"Started by a rerun of {run.id}", reason)
        messages.success(request, message)
        return HttpResponseRedirect(reverse("django_durable:run", args=[shown]))
    context = {
        **run_admin.admin_site.each_context(request),
        "title": f"{chosen.label} run {run.id}?",
        "run": run,
        "action": chosen,
        "refused": refused,
    }
    return render(request, "django_durable/confirm.html", context)
