"""The schedules page: every schedule with its next fire and last runs, and the
buttons to enable, disable and trigger it now (``durable.enable_schedule``,
``disable_schedule``, ``trigger_schedule``), each written to the admin history.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_POST

import django_durable as durable
from django_durable.dashboard import audit
from django_durable.dashboard.paging import page_of
from django_durable.dashboard.site import render_page
from django_durable.models import Run, Schedule

LAST_RUNS = 3


def schedules_page(request, run_admin):
    page = page_of(Schedule.objects.order_by("name"), request)
    for sched in page.items:
        sched.last_runs = _last_runs(sched)
    context = {"page": page, "query_string": ""}
    return render_page(
        request,
        run_admin,
        "django_durable/schedules.html",
        "Schedules",
        context,
        live="django_durable/_schedules_live.html",
    )


def _last_runs(sched: Schedule) -> list[Run]:
    """The latest runs a keyed schedule started (its key's runs, through the key
    index), or for a schedule without a key its last fire's run."""
    runs = Run.objects.defer("input", "context", "result", "state")
    if sched.key:
        return list(
            runs.filter(workflow=sched.workflow, key=sched.key).order_by("-created_at")[:LAST_RUNS]
        )
    if sched.last_run_id:
        return list(runs.filter(id=sched.last_run_id))
    return []


ACTIONS = {"enable": "Enabled schedule", "disable": "Disabled schedule", "trigger": "Triggered"}


@require_POST
def schedule_action(request, run_admin, name, action):
    if action not in ACTIONS:
        raise Http404(f"no action {action!r}")
    back = reverse("django_durable:schedules")
    try:
        if action == "enable":
            durable.enable_schedule(name)
            messages.success(request, f"Schedule {name} is enabled.")
        elif action == "disable":
            durable.disable_schedule(name)
            messages.success(request, f"Schedule {name} is disabled.")
        else:
            run_id = durable.trigger_schedule(name)
            if run_id is None:
                messages.warning(
                    request, f"Schedule {name} fired, but its key's holder answered: no new run."
                )
            else:
                messages.success(request, f"Schedule {name} fired: run {run_id}.")
    except Schedule.DoesNotExist:
        raise Http404(f"no schedule is named {name!r}") from None
    audit.log_schedule(request.user, name, ACTIONS[action])
    return HttpResponseRedirect(back)
