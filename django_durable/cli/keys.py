"""Subcommands about keys and numbers: explain, stats."""

from __future__ import annotations

import django_durable as durable
from django_durable import query
from django_durable import stats as key_stats
from django_durable.cli.base import answering, cell, emit_json, json_value, pairs, table
from django_durable.workflows.definition import registry


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
    values.update(_what_becomes_of_the_input(answer, options["input"]))
    if options["json"]:
        emit_json(out, values)
    else:
        pairs(out, values)


# Outcomes whose new input a new run, the holder or an event takes up.
USES_THE_INPUT = {
    "started": "a new run starts with it",
    "handed_off": "a new run starts with it",
    "cancel_existing": "a new run starts with it",
    "debounced": "the holder is given it",
    "run_again": "the run waiting behind the holder is given it",
    "send_event": "it is the event's payload",
}


def _what_becomes_of_the_input(answer, given) -> dict:
    """``input``: one sentence on what the start would do with its input; when the
    holder answers instead and its input differs, ``dropped_input`` and
    ``holder_input`` too (the Key view shows such a re-add as "dropped")."""
    new = {} if given is None else given
    if answer.outcome == "key_taken":
        return {"input": "not used: the start raises KeyTaken"}
    if answer.outcome in USES_THE_INPUT:
        return {"input": f"used: {USES_THE_INPUT[answer.outcome]}"}
    with answering(answer.holder_id):  # (a holder pruned since: "no run <id>")
        holder = durable.get_run(answer.holder_id).input
    if holder == new:
        return {"input": f"the same as holder {answer.holder_id}'s: nothing is lost"}
    if isinstance(holder, dict) and isinstance(new, dict):
        fields = sorted(k for k in holder.keys() | new.keys() if holder.get(k) != new.get(k))
        differs = f" (differs in: {', '.join(fields)})"
    else:
        differs = ""
    return {
        "input": f"dropped: {cell(new)} is not used; holder {answer.holder_id} keeps its "
        f"input {cell(holder)}{differs}",
        "dropped_input": new,
        "holder_input": holder,
    }


def stats(options, out, err) -> None:
    workflow = options["workflow"]
    statuses = query.status_counts(workflow)
    if workflow is not None and not statuses:
        # A workflow with no run and no definition is a typo, not a workflow of zeros
        # (one whose definition is gone still has its runs counted).
        with answering():
            registry.get(workflow)
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
