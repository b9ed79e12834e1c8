"""Subcommands about queues and flow control: queues, pause, resume, flow."""

from __future__ import annotations

import django_durable as durable
from django_durable.cli.base import answering, emit_json, table
from django_durable.workflows.definition import registry

COLUMNS = ("queue", "paused", "pending", "due", "running", "waiting", "oldest_due_seconds")
FLOW_COLUMNS = (
    "flow_key",
    "running",
    "concurrency_limit",
    "due",
    "started_in_window",
    "rate_limit",
    "next_start_at",
)


def add_parsers(commands) -> None:
    p = commands.add_parser("queues", help="each queue's runs and whether it is paused")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=queues)

    p = commands.add_parser("pause", help="stop claiming a queue's runs")
    p.add_argument("queue", metavar="QUEUE")
    p.set_defaults(handler=pause)

    p = commands.add_parser("resume", help="claim a paused queue's runs again")
    p.add_argument("queue", metavar="QUEUE")
    p.set_defaults(handler=resume)

    p = commands.add_parser(
        "flow", help="a workflow's flow keys: running / limit, due, begins, next start"
    )
    p.add_argument("workflow", metavar="WORKFLOW")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=flow)


# How many of the newest runs ``queues`` reads for queue names (one index read).
RECENT_RUNS = 1000


def queues(options, out, err) -> None:
    """Every queue a person may look for: those with active runs, paused or
    configured ones (``queue_stats``), those of the defined workflows and those
    of the newest runs, finished or not."""
    with answering():
        rows = durable.queue_stats()
        listed = {row["queue"] for row in rows}
        recent = durable.list_executions().order_by("-created_at").values_list("queue", flat=True)
        found = {w.queue for w in registry.all()} | set(recent[:RECENT_RUNS])
        rows += [durable.queue_stats(name)[0] for name in found - listed]
        rows.sort(key=lambda row: row["queue"])
    if options["json"]:
        emit_json(out, rows)
    elif rows:
        table(out, rows, COLUMNS)
    else:
        err.write("no queues yet")


def pause(options, out, err) -> None:
    with answering():
        durable.pause_queue(options["queue"])
    out.write(f"queue {options['queue']!r} paused")


def resume(options, out, err) -> None:
    with answering():
        durable.resume_queue(options["queue"])
    out.write(f"queue {options['queue']!r} resumed")


def flow(options, out, err) -> None:
    """``flow_stats`` of a workflow: one line per flow key with runs due or running."""
    with answering():
        rows = durable.flow_stats(options["workflow"])
    if options["json"]:
        emit_json(out, rows)
    elif rows:
        table(out, rows, FLOW_COLUMNS)
    else:
        err.write(f"no flow key of {options['workflow']} has runs due or running")
