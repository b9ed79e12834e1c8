"""Subcommands about keys and numbers: explain, stats."""

from __future__ import annotations

import django_durable as durable
from django_durable import query
from django_durable import stats as key_stats
from django_durable.cli.base import answering, emit_json, json_value, pairs, table


def add_parsers(commands) -> None:
    p = commands.add_parser("explain", help="what a start would do now (writes nothing)")
    p.add_argument("workflow", metavar="WORKFLOW")
    p.add_argument("--key")
    p.add_argument("--input", type=json_value, default=None, help="JSON object")
    p.add_argument("--on-duplicate", dest="on_duplicate", help="a policy for this start")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=explain)

    p = commands.add_parser("stats", help="runs by status and key statistics")
    p.add_argument("--workflow")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=stats)


def explain(options, out, err) -> None:
    with answering():
        answer = durable.explain(
            options["workflow"],
            options["input"],
            key=options["key"],
            on_duplicate=options["on_duplicate"],
        )
    values = {"outcome": answer.outcome, "holder_id": answer.holder_id, "reason": answer.reason}
    if options["json"]:
        emit_json(out, values)
    else:
        pairs(out, values)


def stats(options, out, err) -> None:
    workflow = options["workflow"]
    statuses = query.status_counts(workflow)
    keys = key_stats.keys(workflow)
    if options["json"]:
        emit_json(out, {"statuses": statuses, "keys": keys})
        return
    table(out, [{"status": s, "runs": n} for s, n in sorted(statuses.items())], ("status", "runs"))
    out.write("")
    pairs(
        out,
        {
            "keys held": keys["keys_held"],
            "re-adds": sum(keys["readds_by_outcome"].values()),
            "dropped inputs": keys["dropped_inputs"],
            "hand-offs": keys["handoffs"],
        },
    )
    if keys["readds_by_outcome"]:
        out.write("")
        rows = [{"outcome": o, "readds": n} for o, n in sorted(keys["readds_by_outcome"].items())]
        table(out, rows, ("outcome", "readds"))
    if keys["top_readded_keys"]:
        out.write("")
        table(out, keys["top_readded_keys"], ("workflow", "key", "readds"))
