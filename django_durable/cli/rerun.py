"""``durable rerun``: one finished run, or every finished run a search matches, from
its first step or from a named one (docs/replay-and-repair.md).

``durable rerun RUN_ID [--from-step S] [--input JSON]`` reruns one run.
``durable rerun --query Q [--from-step S] [--yes] [--again]`` takes every finished
run the search matches: without ``--yes`` it says what it would do for each and
writes nothing; with it, it reruns them one by one, a line per run. A run already
rerun from that step (by this command or any other way) is left alone unless
``--again``, so the same command run twice reruns nothing the second time. Exit
status 1 if any run was refused, 2 on bad usage.
"""

from __future__ import annotations

import uuid

from django.core.management import CommandError

import django_durable as durable
from django_durable import store
from django_durable.cli.base import answering, bad_usage, json_value, refused, run_id
from django_durable.dashboard import search
from django_durable.exceptions import DurableError
from django_durable.models import FINISHED_STATUSES, Run
from django_durable.operations import rerun as rerunning

# Runs read per statement while going through a search's matches.
CHUNK = 500


def add_parsers(commands) -> None:
    p = commands.add_parser(
        "rerun",
        help="start a fresh copy of a finished run (or of every one a search matches), "
        "from its first step or a named one",
    )
    p.add_argument("run_id", type=run_id, metavar="RUN_ID", nargs="?")
    p.add_argument("--query", help='dashboard search, e.g. "workflow:charge status:failed"')
    p.add_argument("--from-step", dest="from_step", metavar="S", help="the step to begin at")
    p.add_argument("--input", type=json_value, metavar="JSON", help="a new input (one run)")
    p.add_argument("--yes", action="store_true", help="rerun what --query matches")
    p.add_argument(
        "--again", action="store_true", help="also rerun runs already rerun from that step"
    )
    p.set_defaults(handler=rerun)


def rerun(options, out, err) -> None:
    if (options["run_id"] is None) == (options["query"] is None):
        raise bad_usage("give either RUN_ID or --query")
    if options["run_id"] is not None:
        if options["yes"] or options["again"]:
            raise bad_usage("--yes and --again go with --query")
        _one(options, out)
    else:
        if options["input"] is not None:
            raise bad_usage("--input goes with one RUN_ID, not --query")
        _many(options, out, err)


def _one(options, out) -> None:
    extra = {"input": options["input"]} if options["input"] is not None else {}
    try:
        with answering(options["run_id"]):
            new = durable.rerun(options["run_id"], from_step=options["from_step"], **extra)
    except CommandError as exc:
        taken = exc.__cause__
        if isinstance(taken, durable.KeyTaken) and taken.holder_id is not None:
            raise refused(
                f"{exc} -- a rerun takes the same key: release it first with "
                f"`durable release-key {taken.holder_id} --by WHO`"
            ) from taken
        raise
    out.write(f"new run {new}")


def _many(options, out, err) -> None:
    parsed = search.parse(options["query"])
    if parsed.errors:
        raise bad_usage("; ".join(parsed.errors))
    from_step, acting = options["from_step"], options["yes"]
    matches = parsed.apply(durable.list_executions()).filter(status__in=FINISHED_STATUSES)
    ids = list(matches.values_list("id", flat=True))
    counts = {"rerun": 0, "refused": 0, "skipped": 0}
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        done = {} if options["again"] else store.rerun_already(chunk, from_step)
        runs = Run.objects.in_bulk(chunk)
        for original_id in chunk:
            run = runs.get(original_id)
            if run is None:
                continue  # pruned meanwhile
            if original_id in done:
                counts["skipped"] += 1
                out.write(f"{run.id} {run.workflow}: already rerun as {done[original_id]}")
                continue
            outcome = _act(run, from_step) if acting else _would(run, from_step)
            counts[outcome[0]] += 1
            out.write(f"{run.id} {run.workflow}: {outcome[1]}")
    _summary(out, err, ids, counts, acting, from_step)
    if counts["refused"] and acting:
        raise refused(f"{counts['refused']} of {len(ids)} run(s) refused")


def _act(run: Run, from_step: str | None) -> tuple[str, str]:
    try:
        new: uuid.UUID = rerunning.start_planned(rerunning.plan_rerun(run, from_step))
    except (DurableError, ValueError, TypeError, LookupError) as exc:
        return "refused", rerunning.refusal(exc)
    return "rerun", f"rerun as {new}"


def _would(run: Run, from_step: str | None) -> tuple[str, str]:
    ok, why = rerunning.explain_rerun(run, from_step)
    return ("rerun", f"would rerun: {why}") if ok else ("refused", f"would be refused: {why}")


def _summary(out, err, ids, counts, acting, from_step) -> None:
    where = f"from step {from_step!r}" if from_step else "from the first step"
    if not ids:
        err.write("no finished runs match")
        return
    skipped = f", {counts['skipped']} already rerun (--again reruns them)"
    if acting:
        out.write(
            f"{counts['rerun']} rerun {where}, {counts['refused']} refused"
            + (skipped if counts["skipped"] else "")
        )
    else:
        out.write(
            f"{len(ids)} finished run(s) match: {counts['rerun']} would be rerun {where}, "
            f"{counts['refused']} would be refused"
            + (skipped if counts["skipped"] else "")
            + "; nothing was done (--yes reruns them)"
        )
