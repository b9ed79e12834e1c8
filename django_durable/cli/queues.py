"""Subcommands about queues: queues, pause, resume."""

from __future__ import annotations

import django_durable as durable
from django_durable.cli.base import answering, emit_json, table

COLUMNS = ("queue", "paused", "pending", "due", "running", "waiting", "oldest_due_seconds")


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


def queues(options, out, err) -> None:
    with answering():
        rows = durable.queue_stats()
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
