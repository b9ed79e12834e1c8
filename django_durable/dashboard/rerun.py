"""The dashboard's replay and repair (docs/replay-and-repair.md): "Rerun from step…"
on a finished run's page, "Rerun with this input" beside each input the Key view
shows dropped, rerun from a step among the runs list's bulk actions, and the links
between a rerun and its original.

Each action is a GET that shows a confirmation and a POST that calls the public
operation (``operations.rerun``) and writes a ``LogEntry`` with the user and the
reason, on the original ("Rerun from step S as run N") and on the new run ("Started
by a rerun of run O"). A refusal (the key rules, a step never begun) is shown with
its reason and writes nothing.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from django.contrib import messages
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

from django_durable import query
from django_durable.dashboard import actions, audit
from django_durable.dashboard.actions import Action
from django_durable.dashboard.timeline import human_duration
from django_durable.exceptions import DurableError
from django_durable.models import FINISHED_STATUSES, Activity, Run
from django_durable.operations import rerun as rerunning
from django_durable.operations import retention
from django_durable.workflows.definition import registry

BULK_SLUG = "rerun-from-step"
BULK_ACTION = Action(
    BULK_SLUG,
    "Rerun from step",
    "Each run starts again as a new run from the step you choose, with the context "
    "its steps before that one left; those steps are not run again. Its key rules apply.",
)
RERUNS_SHOWN = 20
_REFUSED = (DurableError, ValueError, TypeError, LookupError)


@dataclass
class Replay:
    """What a run page shows of replay: where the run came from, its reruns, and the
    steps it may be rerun from."""

    original_id: uuid.UUID | None
    from_step: str | None
    reruns: list[Run]
    more_reruns: bool
    steps: list[str] = field(default_factory=list)
    # Why "Rerun with this input" would be refused ("" when it would start).
    input_refusal: str = ""


def replay_of(run: Run) -> Replay:
    """The run page's replay section (one query for the reruns, one for the steps)."""
    reruns = list(
        query.reruns(run.id).only("id", "status", "rerun_from_step", "created_at")[
            : RERUNS_SHOWN + 1
        ]
    )
    steps = rerunning.rerun_steps(run) if run.status in FINISHED_STATUSES else []
    return Replay(
        run.rerun_of_id,
        run.rerun_from_step,
        reruns[:RERUNS_SHOWN],
        len(reruns) > RERUNS_SHOWN,
        steps,
        dropped_input_offer(run) if run.key is not None else "",
    )


def retention_rows(workflow) -> list[tuple[str, str | None, bool]]:
    """The workflow page's retention: (status, how long as words or None for "until
    pruned by hand", whether the workflow names the status)."""
    return [
        (status, _kept(keep) if keep is not None else None, named)
        for status, keep, named in retention.kept_for(workflow)
    ]


def _kept(keep) -> str:
    """A retention in words: "7 days", "1 day", else as the run page says durations."""
    if keep.days and not keep.seconds and not keep.microseconds:
        return f"{keep.days} day{'s' if keep.days != 1 else ''}"
    return human_duration(keep)


def _run_or_404(run_id) -> Run:
    try:
        return Run.objects.get(id=run_id)
    except Run.DoesNotExist:
        raise Http404(f"no run {run_id}") from None


def _log(user, original: Run, new_id: uuid.UUID, what: str, reason: str | None) -> None:
    audit.log_runs(user, [original.id], f"{what} as run {new_id}", reason)
    audit.log_runs(user, [new_id], f"Started by a rerun of run {original.id}", reason)


def rerun_from_step(request, run_admin, run_id):
    """ "Rerun from step…": a choice of the run's steps, then the rerun."""
    run = _run_or_404(run_id)
    steps = rerunning.rerun_steps(run)
    chosen = request.POST.get("from_step") or request.GET.get("from_step") or None
    ok, why = rerunning.explain_rerun(run, chosen)
    if request.method == "POST":
        where = f"from step {chosen!r}" if chosen else "from its first step"
        return _rerun_posted(
            request,
            run,
            why if not ok else None,
            lambda: rerunning.start_planned(rerunning.plan_rerun(run, chosen)),
            f"Rerun {where}",
            f"started again {where}",
        )
    context = {
        **run_admin.admin_site.each_context(request),
        "title": f"Rerun run {run.id} from a step?",
        "run": run,
        "steps": steps,
        "chosen": chosen,
        "refused": "" if ok else why,
        "answer": why if ok else "",
    }
    return render(request, "django_durable/rerun_confirm.html", context)


def _dropped_input(run: Run, activity_id: int) -> dict:
    """The input of a re-add of the run's key (``key_duplicate`` activity)."""
    activity = Activity.objects.filter(
        id=activity_id,
        kind=Activity.Kind.KEY_DUPLICATE,
        workflow=run.workflow,
        key=run.key,
    ).first()
    if run.key is None or activity is None:
        raise Http404(f"no re-add {activity_id} of the key of run {run.id}")
    value = (activity.details or {}).get("input")
    if not isinstance(value, dict):
        raise Http404(f"re-add {activity_id} has no input")
    return value


def rerun_with_input(request, run_admin, run_id, activity_id):
    """ "Rerun with this input": a rerun of the run with an input its key dropped."""
    run = _run_or_404(run_id)
    payload = _dropped_input(run, activity_id)
    ok, why = rerunning.explain_rerun(run, None, payload)
    if request.method == "POST":
        return _rerun_posted(
            request,
            run,
            why if not ok else None,
            lambda: rerunning.rerun(run.id, input=payload),
            f"Rerun with the input of re-add {activity_id}",
            "started again with that input",
        )
    context = {
        **run_admin.admin_site.each_context(request),
        "title": f"Rerun run {run.id} with this input?",
        "run": run,
        "payload": payload,
        "refused": "" if ok else why,
        "answer": why if ok else "",
        "with_input": True,
    }
    return render(request, "django_durable/rerun_confirm.html", context)


def dropped_input_offer(run: Run) -> str:
    """Why "Rerun with this input" would be refused for ``run`` ("" when it would
    start): the same for each of its dropped inputs (the key rules and the run's
    status decide, not the input)."""
    ok, why = rerunning.explain_rerun(run, None, {})  # any input: the page defers it
    return "" if ok else why


# --- the bulk action ----------------------------------------------------------------


@dataclass
class Outcome:
    run_id: uuid.UUID
    done: bool
    message: str


def bulk(request, runs, context: dict):
    """Rerun from a step the runs of a bulk selection (``bulk.bulk_action``): refused
    for runs of several workflows; a choice of the workflow's steps with the count to
    confirm; then a line per run."""
    workflows = list(runs.order_by().values_list("workflow", flat=True).distinct()[:2])
    if len(workflows) > 1:
        context["problems"] = [
            *context.get("problems", []),
            "Rerun from a step takes runs of one workflow, and the selection has runs of "
            "several: narrow it to one workflow (workflow:NAME in the search).",
        ]
        return render(request, "django_durable/bulk_confirm.html", context)
    try:
        steps = list(registry.get(workflows[0]).step_names()) if workflows else []
    except LookupError:
        steps = []
    chosen = request.POST.get("from_step") or None
    context.update(steps=steps, chosen=chosen, workflow=workflows[0] if workflows else None)
    problems, count = context.get("problems"), context["count"]
    ready = chosen in steps and request.POST.get("confirm") == "yes"
    if not ready or count.more or problems or not count.value:
        return render(request, "django_durable/bulk_rerun_confirm.html", context)
    reason = actions.reason_of(request)
    outcomes = []
    for run in runs.order_by()[: count.value]:
        try:
            new_id = rerunning.start_planned(rerunning.plan_rerun(run, chosen))
        except _REFUSED as exc:
            outcomes.append(Outcome(run.id, False, rerunning.refusal(exc)))
            continue
        _log(request.user, run, new_id, f"Rerun from step {chosen!r}", reason)
        outcomes.append(Outcome(run.id, True, f"rerun from step {chosen!r} as run {new_id}"))
    done = sum(1 for o in outcomes if o.done)
    context.update(
        title=f"{BULK_ACTION.label} {chosen}: {done} of {len(outcomes)} runs",
        outcomes=outcomes,
        done=done,
    )
    return render(request, "django_durable/bulk_done.html", context)


def _rerun_posted(request, run: Run, refused: str | None, start, logged: str, said: str):
    """A confirmed rerun of ``run``: refused with the reason (``refused``, or the one
    ``start`` raises), or started, written to the admin history as ``logged`` and
    said as "Run <id> was <said> as run <new id>"; the redirect either way."""
    run_url = reverse("django_durable:run", args=[run.id])
    if refused is not None:
        messages.error(request, f"Rerun refused: {refused}")
        return HttpResponseRedirect(run_url)
    reason = actions.reason_of(request)
    try:
        new_id = start()
    except _REFUSED as exc:
        messages.error(request, f"Rerun {rerunning.refusal(exc)}")
        return HttpResponseRedirect(run_url)
    _log(request.user, run, new_id, logged, reason)
    messages.success(request, f"Run {run.id} was {said} as run {new_id}.")
    return HttpResponseRedirect(reverse("django_durable:run", args=[new_id]))
