"""Subcommands about runs: list, inspect, retry, cancel, release-key, send-event,
provide-input (rerun: cli/rerun.py)."""

from __future__ import annotations

import django_durable as durable
from django_durable.cli.base import (
    answering,
    bad_usage,
    cell,
    emit_json,
    json_value,
    pairs,
    run_id,
    table,
)
from django_durable.dashboard import search

LIST_COLUMNS = ("id", "workflow", "status", "key", "holds_key", "queue", "created_at")
RUN_FIELDS = (
    "id",
    "workflow",
    "status",
    "queue",
    "key",
    "holds_key",
    "flow_key",
    "input",
    "context",
    "result",
    "error",
    "created_at",
    "started_at",
    "finished_at",
    "rerun_of",
    "rerun_from_step",
)
# A field shown under another name than the model's attribute.
FIELD_ATTRIBUTES = {"rerun_of": "rerun_of_id"}
ATTEMPT_FIELDS = ("step", "attempt", "kind", "status", "worker_id", "started_at", "finished_at")


def add_parsers(commands) -> None:
    p = commands.add_parser("list", help="runs, newest first, filtered by a search")
    p.add_argument("--query", default="", help='dashboard search, e.g. "key:article:42"')
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=list_runs)

    p = commands.add_parser("inspect", help="one run, with its attempts")
    p.add_argument("run_id", type=run_id, metavar="RUN_ID")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=inspect)

    p = commands.add_parser("retry", help="resume a failed run at the step that failed")
    p.add_argument("run_id", type=run_id, metavar="RUN_ID")
    p.set_defaults(handler=retry)

    p = commands.add_parser("cancel", help="cancel a run that is still going")
    p.add_argument("run_id", type=run_id, metavar="RUN_ID")
    p.add_argument("--reason")
    p.set_defaults(handler=cancel)

    p = commands.add_parser("release-key", help="let a finished run's key go")
    p.add_argument("run_id", type=run_id, metavar="RUN_ID")
    p.add_argument("--by", required=True, help="who releases it (kept in the activity)")
    p.set_defaults(handler=release_key)

    p = commands.add_parser("send-event", help="send an event to a run")
    p.add_argument("run_id", type=run_id, metavar="RUN_ID")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--payload", type=json_value, default=None, help="JSON")
    p.add_argument("--buffer", action="store_true", help="keep it until the run waits for it")
    p.set_defaults(handler=send_event)

    p = commands.add_parser("provide-input", help="answer a run waiting for input")
    p.add_argument("run_id", type=run_id, metavar="RUN_ID")
    p.add_argument("name", metavar="NAME")
    p.add_argument("value", type=json_value, metavar="JSON")
    p.set_defaults(handler=provide_input)


def list_runs(options, out, err) -> None:
    parsed = search.parse(options["query"])
    if parsed.errors:
        raise bad_usage("; ".join(parsed.errors))
    if options["limit"] < 1:
        raise bad_usage("--limit must be at least 1")
    runs = parsed.apply(durable.list_executions())[: options["limit"]]
    rows = [{name: getattr(run, name) for name in LIST_COLUMNS} for run in runs]
    if options["json"]:
        emit_json(out, rows)
    elif rows:
        table(out, rows, LIST_COLUMNS)
    else:
        err.write("no runs match")


def inspect(options, out, err) -> None:
    with answering(options["run_id"]):
        run = durable.get_run(options["run_id"])
    # rerun_of: the run this one reruns (``durable rerun``), None for a first run.
    values = {name: getattr(run, FIELD_ATTRIBUTES.get(name, name)) for name in RUN_FIELDS}
    values["now"] = durable.explain_run(run.id)  # what it does or waits for (flow control)
    attempts = [
        {name: getattr(a, name) for name in ATTEMPT_FIELDS} | {"error": a.error}
        for a in run.attempts.order_by("id")
    ]
    if options["json"]:
        emit_json(out, values | {"attempts": attempts})
        return
    traceback = None
    if isinstance(run.error, dict):
        # The error as a person reads it: its headline here, its traceback as lines below.
        traceback = run.error.get("traceback")
        rest = {k: v for k, v in run.error.items() if k not in ("type", "message", "traceback")}
        headline = f"{run.error.get('type', 'Error')}: {run.error.get('message', '')}"
        values["error"] = f"{headline} {cell(rest)}" if rest else headline
    pairs(out, values)
    if traceback:
        out.write("")
        out.write(str(traceback).rstrip("\n"))
    if attempts:
        out.write("")
        table(out, attempts, ATTEMPT_FIELDS)


def retry(options, out, err) -> None:
    with answering(options["run_id"]):
        resumed = durable.retry(options["run_id"])
    out.write(f"run {resumed} resumes")


def cancel(options, out, err) -> None:
    with answering(options["run_id"]):
        durable.cancel(options["run_id"], reason=options["reason"])
    out.write(f"run {options['run_id']} cancelled")


def release_key(options, out, err) -> None:
    with answering(options["run_id"]):
        durable.release_key(options["run_id"], by=options["by"])
    out.write(f"the key of run {options['run_id']} is released")


def send_event(options, out, err) -> None:
    with answering(options["run_id"]):
        durable.send_event(
            options["run_id"], options["name"], options["payload"], buffer=options["buffer"]
        )
    out.write(f"event {options['name']!r} sent to run {options['run_id']}")


def provide_input(options, out, err) -> None:
    with answering(options["run_id"]):
        durable.provide_input(options["run_id"], options["name"], options["value"])
    out.write(f"input {options['name']!r} given to run {options['run_id']}")
