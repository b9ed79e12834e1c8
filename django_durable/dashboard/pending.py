"""The pending inputs page: runs waiting for an input or an event, each with a
form to answer it, and the POST that answers through the public API
(``durable.provide_input`` / ``durable.send_event``), recorded in the history.

The form follows the input's kind (``approval``: approve / reject buttons;
``single_choice`` / ``multi_choice``: the choices; ``free_text``: a text box;
``any`` and ``form``: a JSON field), with the prompt the step gave. An event is
answered with a JSON payload; a ``wait_for_any`` / ``wait_for_all`` with the name
of one of the events it still waits for. A value the input's kind refuses
(``provide_input``'s ``ValueError``) is shown as an error, and nothing is written.
Waiting runs are read a page at a time, oldest first, through the index of
waiting runs (``durable_run_waiting``), never by sorting every waiting run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_POST

import django_durable as durable
from django_durable.dashboard import audit
from django_durable.dashboard.paging import page_of
from django_durable.dashboard.site import render_page
from django_durable.exceptions import DurableError
from django_durable.models import Run, Status
from django_durable.operations import state as run_state
from django_durable.workflows import input_kinds
from django_durable.workflows.definition import registry

MAX_VALUE = 100_000


@dataclass
class Pending:
    run: Run
    wait: str  # "input" or "event"
    name: str
    kind: str = "any"
    prompt: str | None = None
    # (the value as JSON text, the label shown) per choice: a choice keeps its type.
    choices: list[tuple[str, str]] = field(default_factory=list)
    # wait_for_any / wait_for_all: the events still awaited (answered one at a time).
    names: list[str] = field(default_factory=list)
    since: Any = None
    timeout_at: Any = None
    together: str = ""  # "any" or "all" for a wait for several events

    @property
    def kind_label(self) -> str:
        return self.kind.replace("_", " ")


def _described(run: Run) -> Pending:
    """What the run waits for, as its state recorded it (``state.pending_wait``)."""
    wait, _, name = (run.waiting_for or "").partition(":")
    pending = run_state.pending_wait(run.state)
    together, names = "", []
    if wait in ("any", "all"):
        together, names = wait, pending["missing"]
        wait, name = "event", names[0] if names else ""
    kind = pending["input_kind"] if wait == "input" else "any"
    choices = [
        (json.dumps(c, ensure_ascii=False), c if isinstance(c, str) else json.dumps(c))
        for c in (pending["choices"] or [])
    ]
    return Pending(
        run,
        wait,
        name,
        kind if kind in input_kinds.KINDS else "any",
        pending["prompt"] if wait == "input" else None,
        choices,
        names,
        _time(pending["since"]) or run.started_at,
        _time(pending["timeout_at"]) or run.due_at,
        together,
    )


def _time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def waiting_runs(workflow: str | None = None):
    names = [workflow] if workflow else sorted(w.name for w in registry.all())
    return (
        Run.objects.filter(workflow__in=names, status=Status.WAITING)
        .filter(waiting_for__regex=r"^(input|event|any|all):")
        .defer("input", "context", "result")
        .order_by("created_at", "id")
    )


def inputs_page(request, run_admin):
    workflow = request.GET.get("workflow") or None
    page = page_of(waiting_runs(workflow), request)
    page.items = [_described(run) for run in page.items]
    context = {
        "page": page,
        "query_string": "",
        "workflows": sorted(w.name for w in registry.all()),
        "chosen_workflow": workflow,
    }
    return render_page(
        request,
        run_admin,
        "django_durable/inputs.html",
        "Pending inputs",
        context,
        live="django_durable/_inputs_live.html",
    )


class BadAnswer(ValueError):
    pass


def answer_value(post) -> Any:
    """The value the form gives, by the kind it was drawn for."""
    kind = post.get("kind", "any")
    if kind == "approval":
        if post.get("approval") not in ("approve", "reject"):
            raise BadAnswer("Choose approve or reject.")
        return post["approval"] == "approve"
    if kind == "single_choice":
        return _choice(post.get("choice"))
    if kind == "multi_choice":
        return [_choice(v) for v in post.getlist("choice")]
    if kind == "free_text":
        return post.get("text", "")[:MAX_VALUE]
    text = post.get("json", "").strip()
    if len(text) > MAX_VALUE:
        raise BadAnswer(f"The value is longer than {MAX_VALUE} characters.")
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadAnswer(f"Not JSON: {exc}") from None


def _choice(raw):
    """Choices are sent as JSON so a choice keeps its type (1 is not "1")."""
    if raw is None:
        raise BadAnswer("Choose one of the choices.")
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


@require_POST
def answer(request, run_admin, run_id):
    name = request.POST.get("name", "")
    wait = request.POST.get("wait", "input")
    if wait not in ("input", "event") or not name:
        raise Http404("no such wait")
    back = reverse("django_durable:inputs")
    try:
        value = answer_value(request.POST)
        if wait == "input":
            durable.provide_input(run_id, name, value)
        else:
            durable.send_event(run_id, name, value)
    except (BadAnswer, ValueError, TypeError, DurableError) as exc:
        messages.error(request, f"Run {run_id} was not answered: {exc}")
        return HttpResponseRedirect(back)
    except Run.DoesNotExist:
        raise Http404(f"no run {run_id}") from None
    audit.log_runs(request.user, [run_id], f"Answered {wait} {name!r}", _short(value))
    messages.success(request, f"Run {run_id} got its {wait} {name!r}.")
    return HttpResponseRedirect(back)


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 200 else text[:199] + "…"
